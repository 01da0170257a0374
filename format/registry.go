package format

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// Registry is what the encoder and decoder ask a Schema Registry;
// *sr.Client (franz-go's pkg/sr) has it.
type Registry interface {
	SchemaByVersion(ctx context.Context, subject string, version int) (sr.SubjectSchema, error)
	SchemaByID(ctx context.Context, id int) (sr.Schema, error)
	CreateSchema(ctx context.Context, subject string, s sr.Schema) (sr.SubjectSchema, error)
}

// codec writes JSON payloads in one schema and reads them back.
type codec interface {
	// encode appends the body for payload to dst; an error is the
	// payload's fault (it does not fit the schema).
	encode(dst, payload []byte) ([]byte, error)
	// decode reads a body; index is the Protobuf message index.
	decode(body []byte, index []int) (any, error)
	// index is the Protobuf message index written before the body (nil
	// for other formats).
	index() []int
	// recordName is the schema's record (message) name.
	recordName() string
}

// withSchema is a codec with the registry's schema it was made from.
type withSchema struct {
	codec
	schema sr.Schema
}

// schemas caches what the registry said: the id for a subject (the latest
// version for CacheTTL, a pinned version for good) and the codec for an id
// (ids never change meaning). Safe for concurrent use.
type schemas struct {
	reg  Registry
	ttl  time.Duration
	now  func() time.Time
	avro avro.API

	mu        sync.Mutex
	bySubject map[subjectKey]subjectEntry
	byID      map[codecKey]codec
}

type subjectKey struct {
	subject string
	version int // 0: latest
}

type subjectEntry struct {
	id      int
	fetched time.Time
}

type codecKey struct {
	id      int
	message string // Protobuf: the message to encode with
}

func newSchemas(reg Registry, ttl time.Duration) *schemas {
	return &schemas{
		reg:       reg,
		ttl:       ttl,
		now:       time.Now,
		avro:      avro.Config{}.Freeze(),
		bySubject: map[subjectKey]subjectEntry{},
		byID:      map[codecKey]codec{},
	}
}

// forSubject returns the id and codec for a subject's latest version (or
// the pinned version), registering schema under it first when it has
// none and autoRegister is set.
func (s *schemas) forSubject(ctx context.Context, f Format, side Side, subject string, autoRegister bool) (int, codec, error) {
	key := subjectKey{subject: subject, version: side.SchemaVersion}
	s.mu.Lock()
	e, ok := s.bySubject[key]
	s.mu.Unlock()
	if !ok || (side.SchemaVersion == 0 && s.now().Sub(e.fetched) > s.ttl) {
		version, op := -1, "latest version"
		if side.SchemaVersion != 0 {
			version, op = side.SchemaVersion, "pinned version"
		}
		ss, err := s.reg.SchemaByVersion(ctx, subject, version)
		switch {
		case err == nil:
			e = subjectEntry{id: ss.ID}
			s.remember(f, side.Message, ss.ID, ss.Schema)
		case notFound(err) && autoRegister && side.Schema != "":
			ss, err = s.reg.CreateSchema(ctx, subject, sr.Schema{Schema: side.Schema, Type: schemaType(f)})
			if err != nil {
				return 0, nil, &RegistryError{Subject: subject, Op: "register", Err: err}
			}
			e = subjectEntry{id: ss.ID}
		default:
			return 0, nil, &RegistryError{Subject: subject, Op: op, Err: err}
		}
		e.fetched = s.now()
		s.mu.Lock()
		s.bySubject[key] = e
		s.mu.Unlock()
	}
	c, err := s.forID(ctx, f, side.Message, e.id, subject)
	return e.id, c, err
}

// forID returns the codec for a schema id.
func (s *schemas) forID(ctx context.Context, f Format, message string, id int, subject string) (codec, error) {
	key := codecKey{id: id, message: message}
	if c, ok := s.cached(key); ok {
		return c, nil
	}
	sch, err := s.reg.SchemaByID(ctx, id)
	if err != nil {
		return nil, &RegistryError{Subject: subject, Op: "schema id " + strconv.Itoa(id), Err: err}
	}
	return s.parse(f, key, sch)
}

// remember caches the codec of a schema the registry gave, unless it is
// cached already.
func (s *schemas) remember(f Format, message string, id int, sch sr.Schema) (codec, error) {
	key := codecKey{id: id, message: message}
	if c, ok := s.cached(key); ok {
		return c, nil
	}
	return s.parse(f, key, sch)
}

// cached is the codec made for key, if there is one.
func (s *schemas) cached(key codecKey) (codec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.byID[key]
	return c, ok
}

// parse makes the codec for key from sch, the registry's schema under
// key's id, and caches it.
func (s *schemas) parse(f Format, key codecKey, sch sr.Schema) (codec, error) {
	id, message := key.id, key.message
	if want := schemaType(f); sch.Type != want {
		return nil, &SchemaError{Format: f, ID: id, Err: errors.New("the registry holds a " + sch.Type.String() + " schema under this id")}
	}
	var c codec
	var err error
	switch f {
	case Avro:
		c, err = newAvroCodec(s.avro, sch.Schema)
	case JSONSchema:
		c, err = newJSONSchemaCodec(sch.Schema)
	case Protobuf:
		c, err = newProtobufCodec(sch.Schema, message)
	default:
		err = errors.New("not a registry format")
	}
	if err != nil {
		return nil, &SchemaError{Format: f, ID: id, Err: err}
	}
	c = withSchema{codec: c, schema: sch}
	s.mu.Lock()
	s.byID[key] = c
	s.mu.Unlock()
	return c, nil
}

func schemaType(f Format) sr.SchemaType {
	switch f {
	case Protobuf:
		return sr.TypeProtobuf
	case JSONSchema:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}

// notFound reports a registry answer of 404: no such subject or version.
func notFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && (re.StatusCode == http.StatusNotFound || sr.IsNotFoundError(re.ErrorCode))
}
