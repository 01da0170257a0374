package format

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonSchemaCodec validates JSON payloads against one JSON Schema
// (santhosh-tekuri/jsonschema: drafts 4 to 2020-12, formats asserted) and
// writes them unchanged.
type jsonSchemaCodec struct {
	schema *jsonschema.Schema
	title  string
}

// noLoader refuses every $ref outside the schema: a schema from the
// registry must not make outboxd read files or fetch URLs.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref %s: outboxd resolves no references outside the schema", url)
}

func newJSONSchemaCodec(text string) (*jsonSchemaCodec, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	c.AssertFormat()
	const loc = "urn:outboxd:schema"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, err
	}
	title := ""
	if m, ok := doc.(map[string]any); ok {
		title, _ = m["title"].(string)
	}
	return &jsonSchemaCodec{schema: s, title: title}, nil
}

func (c *jsonSchemaCodec) index() []int { return nil }

// recordName is the schema's title, which Confluent's JSON Schema
// serializer uses as the record name too.
func (c *jsonSchemaCodec) recordName() string { return c.title }

func (c *jsonSchemaCodec) encode(dst, payload []byte) ([]byte, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if err := c.schema.Validate(v); err != nil {
		return nil, err
	}
	return append(dst, payload...), nil
}

func (c *jsonSchemaCodec) decode(body []byte, _ []int) (any, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if err := c.schema.Validate(v); err != nil {
		return nil, err
	}
	return v, nil
}
