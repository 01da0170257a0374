package outbox

import "io"

// Closers are what a session opened that must be closed when it ends (a
// dead-letterer, hooks): closed in the reverse order they were opened, on
// the session's way out or when opening the next one failed.
type Closers []io.Closer

// Add keeps v to be closed, if it is an io.Closer.
func (c *Closers) Add(v any) {
	if cl, ok := v.(io.Closer); ok {
		*c = append(*c, cl)
	}
}

// CloseAll closes them, the last opened first.
func (c *Closers) CloseAll() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i].Close()
	}
}
