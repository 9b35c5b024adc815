package shrink

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/turncheck/turncheck/faults"
)

// TestWithoutUntidyStop: a replay's server stopped untidily is no error
// of the replay's, wrapped or joined; any other error it came with stays.
func TestWithoutUntidyStop(t *testing.T) {
	untidy := &faults.StopError{}
	other := errors.New("the store did not close")
	assert.NoError(t, withoutUntidyStop(untidy))
	assert.NoError(t, withoutUntidyStop(fmt.Errorf("stop the server under test: %w", untidy)))
	assert.NoError(t, withoutUntidyStop(errors.Join(nil, fmt.Errorf("stop: %w", untidy))))
	assert.ErrorIs(t, withoutUntidyStop(errors.Join(other, untidy)), other)
	assert.ErrorIs(t, withoutUntidyStop(fmt.Errorf("stop: %w", errors.Join(untidy, other))), other)
	assert.ErrorIs(t, withoutUntidyStop(other), other)
}
