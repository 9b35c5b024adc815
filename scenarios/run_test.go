package scenarios

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
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
	m := regexp.MustCompile(`replay: TURNCHECK_REPLAY=(testdata/turncheck/TestConversations_sub_test-T4-\d+\.json) go test -run '\^TestConversations\$/\^sub test\$' \.`).
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

// TestPlanCheck: a plan read from a file that cannot be executed is
// refused before anything is sent, with the reason.
func TestPlanCheck(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	two := burstOn(conv, 1, 2, 0, 1)
	assert.NoError(t, two.check())
	for name, p := range map[string]Plan{
		"no request":        {Action: "x"},
		"release too short": {Action: "x", Sends: two.Sends, Release: []int{0}},
		"release twice":     {Action: "x", Sends: two.Sends, Release: []int{1, 1}},
		"release outside":   {Action: "x", Sends: two.Sends, Release: []int{0, 5}},
		"hold in a burst": func() Plan {
			p := burstOn(conv, 1, 2, 0, 1)
			p.Sends[1].Fault = faults.Fault{Kind: faults.Hold}
			return p
		}(),
		"no messages": {Action: "x", Sends: []Send{{Conv: conv, Token: "tc-u1"}}, Release: []int{0}},
	} {
		assert.Error(t, p.check(), name)
		_, _, err := Replay(Reference{}, []Plan{two, p})
		assert.ErrorContains(t, err, "step 2", name)
	}
}

// TestJUnitHarnessFailure: a run the harness itself failed shows no
// invariant as held.
func TestJUnitHarnessFailure(t *testing.T) {
	rep := NewReport(&Result{Stats: *newStats(), Failure: &Failure{Report: "boom"}}, ServerSpec{Kind: "go"})
	var b strings.Builder
	require.NoError(t, rep.WriteJUnit(&b))
	assert.Contains(t, b.String(), `<testcase name="harness"`)
	assert.Contains(t, b.String(), `failures="1"`)
}

// refuseAll starts servers that answer 400 to every request.
type refuseAll struct{}

func (refuseAll) Profile() Profile { return Profile{} }
func (refuseAll) Start(string) (Server, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"no","type":"invalid_request_error"}}`))
	}))
	return closeServer{srv}, nil
}

type closeServer struct{ *httptest.Server }

func (s closeServer) URL() string  { return s.Server.URL }
func (s closeServer) Close() error { s.Server.Close(); return nil }
