package scenarios

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// TestSaveForTest: a Go test's failure is saved under testdata/turncheck/,
// the message gives the exact command that replays it, and the saved
// file, read back, replays to the same violation.
func TestSaveForTest(t *testing.T) {
	t.Chdir(t.TempDir())
	target := Reference{Mutant: sut.ForkNewSession}
	res, err := Check(target, Options{Checks: 50})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation)

	msg := saveForTest("TestConversations/sub test", res, target)
	m := regexp.MustCompile(`replay: TURNCHECK_REPLAY=(testdata/turncheck/TestConversations_sub_test-T4-\d+\.json) go test -run '\^TestConversations/sub test\$' \.`).
		FindStringSubmatch(msg)
	require.NotNil(t, m, msg)

	saved, err := ReadReport(m[1])
	require.NoError(t, err)
	assert.Equal(t, ServerSpec{Kind: "reference", Mutant: "fork-new-session", Concurrency: "serialize"}, saved.Server)
	assert.Equal(t, "fail", saved.Verdict)
	_, v, err := Replay(target, saved.Failure.Plans)
	require.NoError(t, err)
	require.NotNil(t, v)
	assert.Equal(t, model.T4, v.Invariant)
	assert.Equal(t, res.Failure.Violation.Error(), v.Error())
}
