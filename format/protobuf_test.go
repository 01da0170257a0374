package format

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxd/outboxd/kafka"
)

const orderProto = `syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Envelope { string note = 1; }
message OrderCreated {
  string id = 1;
  int64 qty = 2;
  google.protobuf.Timestamp at = 3;
  enum Status { NEW = 0; PAID = 1; }
  Status status = 4;
  message Line { string sku = 1; int32 n = 2; }
  repeated Line lines = 5;
}
`

func TestEncodeProtobuf(t *testing.T) {
	reg := newFakeRegistry()
	id := reg.add("orders-value", sr.Schema{Type: sr.TypeProtobuf, Schema: orderProto})
	ctx := context.Background()
	for _, tc := range []struct {
		message string
		index   []int
		payload string
	}{
		{"shop.OrderCreated", []int{1}, `{"id":"o1","qty":"3","at":"2026-12-02T09:00:00.500Z","status":"PAID","lines":[{"sku":"a","n":2}]}`},
		{"shop.OrderCreated.Line", []int{1, 0}, `{"sku":"b","n":1}`},
		{"", []int{0}, `{"note":"x"}`},
	} {
		e := newTestEncoder(t, Config{Value: Side{Format: Protobuf, Message: tc.message}}, reg)
		r := record(tc.payload)
		if err := e.Encode(ctx, r); err != nil {
			t.Fatalf("%s: %v", tc.message, err)
		}
		var h sr.ConfluentHeader
		gotID, rest, err := h.DecodeID(r.Value)
		if err != nil || gotID != id {
			t.Fatalf("id %d err %v", gotID, err)
		}
		index, body, err := h.DecodeIndex(rest, 8)
		if err != nil || len(index) != len(tc.index) || index[0] != tc.index[0] {
			t.Fatalf("%s: index %v, want %v (%v)", tc.message, index, tc.index, err)
		}
		v, err := NewDecoder(reg).Decode(ctx, Protobuf, r.Value)
		if err != nil {
			t.Fatal(err)
		}
		m := v.Decoded.(*dynamicpb.Message)
		want := dynamicpb.NewMessage(m.Descriptor())
		if err := protojson.Unmarshal([]byte(tc.payload), want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(m, want) || len(body) == 0 && tc.payload != "{}" {
			t.Fatalf("%s: decoded %v, want %v", tc.message, m, want)
		}
	}
	e := newTestEncoder(t, Config{Value: Side{Format: Protobuf, Message: "shop.OrderCreated"}}, reg)
	for _, p := range []string{`{"qty":"x"}`, `{"unknown":1}`, `{"status":"LOST"}`, `[]`} {
		if err := e.Encode(ctx, record(p)); !errors.Is(err, kafka.ErrPoison) {
			t.Fatalf("%s: err = %v, want poison", p, err)
		}
	}
	if _, err := NewEncoder(Config{Value: Side{Format: Protobuf, Message: "shop.Nope"}}, reg, nil, nil); err != nil {
		t.Fatal(err) // found only when a record needs it
	}
	e = newTestEncoder(t, Config{Value: Side{Format: Protobuf, Message: "shop.Nope"}}, reg)
	var se *SchemaError
	if err := e.Encode(ctx, record(`{}`)); !errors.As(err, &se) || errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("unknown message: err = %v, want a SchemaError, not poison", err)
	}
}
