package format

import "errors"

func newProtobufCodec(text, message string) (codec, error) {
	return nil, errors.New("protobuf is not supported yet")
}
