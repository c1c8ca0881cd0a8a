package ocsf

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
)

// LevelOff is above every record's level: an emitter at it writes nothing
// (it still formats records for the access log).
const LevelOff = slog.Level(math.MaxInt32)

// ParseLevel parses --ocsf-level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--ocsf-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// DefaultProduct names applistener with an unknown version.
var DefaultProduct = Product{Name: "applistener", VendorName: "applistener"}

// Emitter writes OCSF records, one JSON object per line, to a writer (the
// process's bounded log writer) at a level of its own, independent of the
// diagnostic log's. A nil Emitter writes nothing; its methods are safe to
// call.
type Emitter struct {
	w       io.Writer
	level   slog.Level
	product Product
}

// NewEmitter returns an emitter writing records at level and above to w
// (nothing when w is nil), naming product in their metadata (its Name and
// VendorName default to applistener).
func NewEmitter(w io.Writer, level slog.Level, product Product) *Emitter {
	if product.Name == "" {
		product.Name = DefaultProduct.Name
	}
	if product.VendorName == "" {
		product.VendorName = DefaultProduct.VendorName
	}
	if w == nil {
		level = LevelOff
	}
	return &Emitter{w: w, level: level, product: product}
}

// Enabled reports whether a record at level would be written. Callers
// check it before building a record on a busy path.
func (e *Emitter) Enabled(level slog.Level) bool {
	return e != nil && level >= e.level && e.level != LevelOff
}

// Emit writes ev as one line if its level is enabled.
func (e *Emitter) Emit(ev *Event) {
	if !e.Enabled(ev.Level) {
		return
	}
	_, _ = e.w.Write(e.Append(nil, ev))
}

// Append appends ev, with the emitter's metadata, as one JSON line to b.
func (e *Emitter) Append(b []byte, ev *Event) []byte {
	p := DefaultProduct
	if e != nil {
		p = e.product
	}
	ev.Metadata = Metadata{Product: p, Version: SchemaVersion}
	out, err := json.Marshal(ev)
	if err != nil {
		// Only an unsupported value in Entity.Data could fail: never
		// write half a record.
		return b
	}
	b = append(b, out...)
	return append(b, '\n')
}
