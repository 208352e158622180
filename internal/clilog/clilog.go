// Package clilog is the one log format of pd3's command: every line on
// stderr reads "pd3: [warning: |error: ]message key=value ...", whether it
// is a start-up notice ("pd3: NBD server listening on ...") or a library's
// structured log record. Values are quoted as slog's text handler quotes
// them, so a line stays machine-readable after its message.
package clilog

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// Prefix starts every line.
const Prefix = "pd3: "

// New returns a logger writing lines at level and above to w.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	h := &handler{sh: &shared{w: w}}
	h.inner = slog.NewTextHandler(&h.sh.buf, &slog.HandlerOptions{Level: level, ReplaceAttr: dropHeader})
	return slog.New(h)
}

// shared is what a handler and the handlers derived from it by WithAttrs
// and WithGroup write through: one lock, so lines never interleave.
type shared struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

type handler struct {
	sh    *shared
	inner slog.Handler // formats the attributes into sh.buf
}

// dropHeader removes the text handler's own time, level and message: the
// line carries the level as a word and the message first, unquoted.
func dropHeader(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 {
		switch a.Key {
		case slog.TimeKey, slog.LevelKey, slog.MessageKey:
			return slog.Attr{}
		}
	}
	return a
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	var word string
	switch {
	case r.Level >= slog.LevelError:
		word = "error: "
	case r.Level >= slog.LevelWarn:
		word = "warning: "
	}
	attrs := slog.NewRecord(r.Time, r.Level, "", r.PC)
	r.Attrs(func(a slog.Attr) bool { attrs.AddAttrs(a); return true })
	h.sh.mu.Lock()
	defer h.sh.mu.Unlock()
	h.sh.buf.Reset()
	if err := h.inner.Handle(ctx, attrs); err != nil {
		return err
	}
	rest := strings.TrimSpace(h.sh.buf.String())
	var line strings.Builder
	line.Grow(len(Prefix) + len(word) + len(r.Message) + len(rest) + 2)
	line.WriteString(Prefix)
	line.WriteString(word)
	line.WriteString(r.Message)
	if rest != "" {
		line.WriteByte(' ')
		line.WriteString(rest)
	}
	line.WriteByte('\n')
	_, err := io.WriteString(h.sh.w, line.String())
	return err
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{sh: h.sh, inner: h.inner.WithAttrs(as)}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{sh: h.sh, inner: h.inner.WithGroup(name)}
}
