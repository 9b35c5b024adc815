//go:build !unix

package reference

import (
	"errors"

	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// startACP is not offered off Unix: the harness's ACP client is Unix's.
func startACP(sut.Config, targets.ACPCapabilities) (targets.Server, error) {
	return nil, errors.New("the reference server as an ACP agent runs on Unix systems only")
}
