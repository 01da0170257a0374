package main

import (
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

// The end-to-end tests outside this package decode "outboxd status --json"
// into e2e.StatusReport. It must have the report's fields, with the same
// JSON names and kinds, or those tests would stop checking what they read.
func TestStatusReportMirrorIsComplete(t *testing.T) {
	var shape func(reflect.Type, string) map[string]string
	shape = func(typ reflect.Type, prefix string) map[string]string {
		out := map[string]string{}
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct {
			return out
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name := prefix + f.Tag.Get("json")
			out[name] = f.Type.Kind().String()
			if f.Type.Kind() == reflect.Pointer || f.Type.Kind() == reflect.Slice {
				out[name] += "/" + f.Type.Elem().Kind().String()
			}
			for k, v := range shape(f.Type, name+".") {
				out[k] = v
			}
		}
		return out
	}
	want := shape(reflect.TypeFor[statusReport](), "")
	got := shape(reflect.TypeFor[e2e.StatusReport](), "")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("e2e.StatusReport's JSON fields:\n%v\nwant statusReport's:\n%v", got, want)
	}
}
