package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/spf13/cobra"
)

func parseID(s string) (pageid.Key, error) {
	v, p, ok := strings.Cut(s, ":")
	if !ok {
		return 0, fmt.Errorf("bad page id %q: want VOLUME:PAGE, e.g. 1:0", s)
	}
	vol, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("bad volume id in %q", s)
	}
	pg, err := strconv.ParseUint(p, 10, 48)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("page number %s in %q is past the last a volume can have, %d (2^48-1)", p, s, uint64(1)<<48-1)
	}
	if err != nil {
		return 0, fmt.Errorf("bad page number in %q: want a decimal number, e.g. 1:0", s)
	}
	return pageid.MakeKey(uint16(vol), pg), nil
}

func pageCmd() *cobra.Command {
	var addr string
	var timeout time.Duration
	// with runs fn with a connected client under the --timeout deadline.
	with := func(cmd *cobra.Command, fn func(context.Context, *pageproto.Client) error) error {
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		c, err := pageproto.Dial(ctx, addr, pageproto.ClientOptions{OpTimeout: timeout})
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(ctx, c)
	}
	cmd := &cobra.Command{Use: "page", Short: "Read and write pages over the page protocol"}
	cmd.PersistentFlags().StringVar(&addr, "page", "127.0.0.1:7000", "page server address")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	cmd.AddCommand(&cobra.Command{
		Use: "get VOLUME:PAGE", Short: "Write a page to stdout", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return with(cmd, func(ctx context.Context, c *pageproto.Client) error {
				buf := make([]byte, pageid.Size)
				if err := c.Get(ctx, id, buf); err != nil {
					return describe(ctx, c, id, err)
				}
				_, err := os.Stdout.Write(buf)
				return err
			})
		},
	}, &cobra.Command{
		Use: "put VOLUME:PAGE", Short: "Store stdin (up to one page, zero-padded) as a page", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			buf := make([]byte, pageid.Size+1)
			n, err := io.ReadFull(os.Stdin, buf)
			if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
				return err
			}
			if n > pageid.Size {
				return fmt.Errorf("stdin holds more than one page (%d bytes)", pageid.Size)
			}
			return with(cmd, func(ctx context.Context, c *pageproto.Client) error {
				return describe(ctx, c, id, c.Put(ctx, id, buf[:pageid.Size]))
			})
		},
	}, &cobra.Command{
		Use: "sync", Short: "Wait until acknowledged writes are at the memory node", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, c *pageproto.Client) error {
				return c.Sync(ctx)
			})
		},
	})
	return cmd
}

// describe adds to an error about page id what the user needs to fix the
// id: the size of its volume, or the volumes the server has.
func describe(ctx context.Context, c *pageproto.Client, id pageid.Key, err error) error {
	noVol, past := errors.Is(err, pageid.ErrNoVolume), errors.Is(err, pageid.ErrOutOfRange)
	if !noVol && !past {
		return err
	}
	vs, more, lerr := c.Volumes(ctx)
	if lerr != nil {
		return err // an older server: the error as it is
	}
	if past {
		for _, v := range vs {
			if v.ID == id.Volume() {
				n := v.Size / pageid.Size
				return fmt.Errorf("%w: volume %d (%s) has %d pages, %d:0 to %d:%d", err, v.ID, v.Name, n, v.ID, v.ID, n-1)
			}
		}
	}
	list := make([]string, 0, len(vs)+1)
	for _, v := range vs {
		list = append(list, fmt.Sprintf("%d (%s, %d pages)", v.ID, v.Name, v.Size/pageid.Size))
	}
	if more {
		list = append(list, "…")
	}
	if len(list) == 0 {
		return fmt.Errorf("%w: this server serves no volumes", err)
	}
	return fmt.Errorf("%w: this server serves volumes %s", err, strings.Join(list, ", "))
}
