package sut

import (
	"context"
	"io"

	"github.com/turncheck/turncheck/sut/internal/acp"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// ServeACP opens a server with cfg and serves one ACP client on in (the
// client's requests, the server's stdin) and out (the server's answers and
// notifications, its stdout), until in ends, out fails (a write the client
// does not take within StreamWriteTimeout), or ctx ends. It then closes the
// server: when the client left (in ended, out failed), the prompts still
// running are interrupted as an HTTP turn whose client disconnects is
// (Config.Interruption); when ctx ended, they are dropped, as a stop
// drops the turns still running, and each is answered with an error. It
// returns once the store is closed. Config's HTTP-only fields (Keys,
// ConversationHeader, the connection limits) play no part: a stdio client
// is the process's parent, and its sessions are of no key.
//
// When ctx ends first, the goroutine reading in keeps waiting for its next
// line until in ends; the caller owns in and closes it.
func ServeACP(ctx context.Context, cfg config.Config, in io.Reader, out io.Writer) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	return acp.Serve(ctx, s.engine, s.Close, in, out)
}
