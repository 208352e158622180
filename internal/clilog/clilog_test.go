package clilog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLines(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		want string
	}{
		{"notice", func(l *slog.Logger) { l.Info("NBD server listening on 127.0.0.1:10809") },
			"pd3: NBD server listening on 127.0.0.1:10809\n"},
		{"attrs quoted", func(l *slog.Logger) {
			l.Warn("nbd: closing connection", "remote", "127.0.0.1:5", "err", "bad magic 0x4e")
		},
			`pd3: warning: nbd: closing connection remote=127.0.0.1:5 err="bad magic 0x4e"` + "\n"},
		{"error", func(l *slog.Logger) { l.Error("host: write-back failed", "pages", 3) },
			"pd3: error: host: write-back failed pages=3\n"},
		{"with attrs and group", func(l *slog.Logger) { l.With("volume", "disk0").WithGroup("lease").Info("renewed", "ttl", "5s") },
			"pd3: renewed volume=disk0 lease.ttl=5s\n"},
		{"below level", func(l *slog.Logger) { l.Debug("noise") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.log(New(&b, slog.LevelInfo))
			assert.Equal(t, tc.want, b.String())
		})
	}
}

// Lines from loggers derived from one another never interleave.
func TestConcurrentLinesWhole(t *testing.T) {
	var b bytes.Buffer
	l := New(&b, slog.LevelInfo)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ll := l.With("g", g)
			for i := 0; i < 200; i++ {
				ll.Info("line", "i", i)
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	assert.Len(t, lines, 8*200)
	for _, ln := range lines {
		assert.Regexp(t, `^pd3: line g=\d i=\d+$`, ln)
	}
}
