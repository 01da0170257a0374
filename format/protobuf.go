package format

import (
	"context"
	"errors"
	"fmt"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protobufCodec writes JSON payloads (Protobuf's canonical JSON mapping)
// as one message of a .proto file from the registry: the text is compiled
// by bufbuild/protocompile into descriptors, payloads are read with
// protojson into a dynamicpb message and written with proto.Marshal.
type protobufCodec struct {
	file protoreflect.FileDescriptor
	msg  protoreflect.MessageDescriptor
	idx  []int // the message's index path, written before the body
}

const protoFileName = "registry.proto"

func newProtobufCodec(text, message string) (*protobufCodec, error) {
	c := protocompile.Compiler{
		// The well-known types (google/protobuf/timestamp.proto, ...) are
		// known; any other import is not (registry references are not
		// followed).
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{protoFileName: text}),
		}),
	}
	files, err := c.Compile(context.Background(), protoFileName)
	if err != nil {
		return nil, err
	}
	fd := files.FindFileByPath(protoFileName)
	if fd == nil {
		return nil, errors.New("compiled, but no file")
	}
	pc := &protobufCodec{file: fd}
	if fd.Messages().Len() == 0 {
		return nil, errors.New("the schema declares no message")
	}
	if message == "" {
		pc.msg, pc.idx = fd.Messages().Get(0), []int{0}
		return pc, nil
	}
	if pc.msg, pc.idx = findMessage(fd.Messages(), protoreflect.FullName(message), nil); pc.msg == nil {
		return nil, fmt.Errorf("the schema has no message %s", message)
	}
	return pc, nil
}

// findMessage looks name up among ms and their nested messages, and
// returns it with its index path (Confluent's message indexes).
func findMessage(ms protoreflect.MessageDescriptors, name protoreflect.FullName, path []int) (protoreflect.MessageDescriptor, []int) {
	for i := range ms.Len() {
		m := ms.Get(i)
		p := append(append([]int(nil), path...), i)
		if m.FullName() == name {
			return m, p
		}
		if found, fp := findMessage(m.Messages(), name, p); found != nil {
			return found, fp
		}
	}
	return nil, nil
}

// messageAt is the message an index path names.
func (c *protobufCodec) messageAt(index []int) (protoreflect.MessageDescriptor, error) {
	if len(index) == 0 {
		index = []int{0}
	}
	ms := c.file.Messages()
	var m protoreflect.MessageDescriptor
	for _, i := range index {
		if i < 0 || i >= ms.Len() {
			return nil, fmt.Errorf("message index %v: no such message", index)
		}
		m = ms.Get(i)
		ms = m.Messages()
	}
	return m, nil
}

func (c *protobufCodec) index() []int { return c.idx }

func (c *protobufCodec) recordName() string { return string(c.msg.FullName()) }

func (c *protobufCodec) encode(dst, payload []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(c.msg)
	// Unknown fields are errors: a payload the schema cannot hold is a bad
	// event, never a record with parts of it dropped.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(payload, m); err != nil {
		return nil, err
	}
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, m)
}

func (c *protobufCodec) decode(body []byte, index []int) (any, error) {
	md, err := c.messageAt(index)
	if err != nil {
		return nil, err
	}
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, err
	}
	return m, nil
}
