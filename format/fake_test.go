package format

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// fakeRegistry is an in-process registry for unit tests: subjects with
// versions, ids counting from 1, and a switch that makes it unreachable.
type fakeRegistry struct {
	mu       sync.Mutex
	subjects map[string][]sr.SubjectSchema
	byID     map[int]sr.Schema
	down     bool
	calls    int
}

func newFakeRegistry() *fakeRegistry {
	return &fakeRegistry{subjects: map[string][]sr.SubjectSchema{}, byID: map[int]sr.Schema{}}
}

var errDown = errors.New("connection refused")

func (f *fakeRegistry) add(subject string, s sr.Schema) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := len(f.byID) + 1
	f.byID[id] = s
	f.subjects[subject] = append(f.subjects[subject], sr.SubjectSchema{Subject: subject, Version: len(f.subjects[subject]) + 1, ID: id, Schema: s})
	return id
}

func (f *fakeRegistry) SchemaByVersion(_ context.Context, subject string, version int) (sr.SubjectSchema, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return sr.SubjectSchema{}, errDown
	}
	vs := f.subjects[subject]
	switch {
	case len(vs) == 0:
		return sr.SubjectSchema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, ErrorCode: 40401, Message: "Subject not found"}
	case version == -1:
		return vs[len(vs)-1], nil
	case version < 1 || version > len(vs):
		return sr.SubjectSchema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, ErrorCode: 40402, Message: "Version not found"}
	}
	return vs[version-1], nil
}

func (f *fakeRegistry) SchemaByID(_ context.Context, id int) (sr.Schema, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return sr.Schema{}, errDown
	}
	s, ok := f.byID[id]
	if !ok {
		return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, ErrorCode: 40403, Message: "Schema not found"}
	}
	return s, nil
}

func (f *fakeRegistry) CreateSchema(_ context.Context, subject string, s sr.Schema) (sr.SubjectSchema, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		return sr.SubjectSchema{}, errDown
	}
	id := f.add(subject, s)
	return sr.SubjectSchema{Subject: subject, ID: id, Schema: s}, nil
}
