package sut

import (
	"context"

	"github.com/turncheck/turncheck/internal/stall"
)

// stall pauses for a random 0..Config.Stall (stall.Sleep): at the points
// where a busy machine leaves a turn waiting longest, before a model call,
// before a commit and before each write to the client. It ends early when
// ctx ends or the server crashes, so that a stalled server still stops
// at once. With Stall 0 it returns at once.
func (s *Server) stall(ctx context.Context) {
	stall.Sleep(ctx, s.cfg.Stall, s.life.Done())
}
