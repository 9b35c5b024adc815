package scenarios

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// TestSaveForTest: a Go test's failure is saved under testdata/turncheck/,
// the message gives the exact command that replays it, and the saved
// file, read back, replays to the same violation.
func TestSaveForTest(t *testing.T) {
	// The test runs in its package's directory, in a module: the replay
	// command is given from the module's root.
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/m\n"), 0o644))
	pkg := filepath.Join(root, "sub", "pkg")
	require.NoError(t, os.MkdirAll(pkg, 0o755))
	t.Chdir(pkg)
	target := reference.Target{Mutant: sut.ForkNewSession}
	res, err := Check(target, Options{Checks: 50, Seed: 1})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation)

	msg := saveForTest("TestConversations/sub test", res, target)
	m := regexp.MustCompile(`replay: TURNCHECK_REPLAY=(/\S+/sub/pkg/testdata/turncheck/TestConversations_sub_test-T4-\d+\.json) go test -run '\^TestConversations\$/\^sub test\$' \./sub/pkg\n?$`).
		FindStringSubmatch(msg)
	require.NotNil(t, m, msg)
	assert.Contains(t, msg, "saved: testdata/turncheck/TestConversations_sub_test-T4-")

	saved, err := report.ReadReport(m[1])
	require.NoError(t, err)
	assert.Equal(t, targets.ServerSpec{Kind: "reference", Mutant: "fork-new-session", Concurrency: "serialize"}, saved.Server)
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
	two := plan.Burst(conv, 1, 2, 0, 1)
	assert.NoError(t, two.Check())
	for name, p := range map[string]plan.Plan{
		"no request":        {Action: "x"},
		"release too short": {Action: "x", Sends: two.Sends, Release: []int{0}},
		"release twice":     {Action: "x", Sends: two.Sends, Release: []int{1, 1}},
		"release outside":   {Action: "x", Sends: two.Sends, Release: []int{0, 5}},
		"hold in a burst": func() plan.Plan {
			p := plan.Burst(conv, 1, 2, 0, 1)
			p.Sends[1].Fault = faults.Fault{Kind: faults.Hold}
			return p
		}(),
		"no messages":           {Action: "x", Sends: []plan.Send{{Conv: conv, Token: "tc-u1"}}, Release: []int{0}},
		"empty tool round":      toolPlan(conv, func(s *plan.Send) { s.Rounds = []faults.Round{{}} }),
		"unknown tool":          toolPlan(conv, func(s *plan.Send) { s.Rounds = []faults.Round{{"shell"}} }),
		"fault past the rounds": toolPlan(conv, func(s *plan.Send) { s.Fault = faults.Fault{Kind: faults.Status, Round: 2} }),
		"abort point, no abort": toolPlan(conv, func(s *plan.Send) { s.AbortAt = &faults.Point{Round: 1} }),
		"abort past the rounds": toolPlan(conv, func(s *plan.Send) { s.Abort, s.AbortAt = true, &faults.Point{Round: 2} }),
		"abort in an echo":      toolPlan(conv, func(s *plan.Send) { s.Abort, s.AbortAt = true, &faults.Point{Round: 1, Tool: 2} }),
		"abort later in a burst": func() plan.Plan {
			p := plan.Burst(conv, 1, 2, 0, 1)
			p.Sends[0].Abort, p.Sends[0].AbortAt = true, &faults.Point{Chunks: 1}
			return p
		}(),
	} {
		assert.Error(t, p.Check(), name)
		_, _, err := Replay(reference.Target{}, []plan.Plan{two, p})
		assert.ErrorContains(t, err, "step 2", name)
	}
}

// toolPlan is a sequential turn on conv with one tool round (a lookup,
// then an echo), changed by edit.
func toolPlan(conv model.ConversationRef, edit func(*plan.Send)) plan.Plan {
	s := plan.TurnSend(conv, "tc-u1", false)
	s.Rounds = []faults.Round{{faults.ToolLookup, faults.ToolEcho}}
	edit(&s)
	return plan.Single("continue", s)
}

// TestPlanCheckTools: a turn's tool rounds, the round its fault hits and
// the point its client drops it at are taken as drawn when they fit.
func TestPlanCheckTools(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	for name, edit := range map[string]func(*plan.Send){
		"plain rounds":        func(*plan.Send) {},
		"fault at the reply":  func(s *plan.Send) { s.Fault = faults.Fault{Kind: faults.Cut, Round: 1} },
		"abort in the lookup": func(s *plan.Send) { s.Abort, s.AbortAt = true, &faults.Point{Round: 1, Tool: 1} },
		"abort mid-answer":    func(s *plan.Send) { s.Abort, s.AbortAt = true, &faults.Point{Round: 1, Chunks: 2} },
	} {
		assert.NoError(t, toolPlan(conv, edit).Check(), name)
	}
}

// TestJUnitHarnessFailure: a run the harness itself failed shows no
// invariant as held.
func TestJUnitHarnessFailure(t *testing.T) {
	rep := report.NewReport(&report.Result{Stats: *report.NewStats(), Failure: &report.Failure{Report: "boom"}}, targets.ServerSpec{Kind: "go"})
	var b strings.Builder
	require.NoError(t, rep.WriteJUnit(&b))
	assert.Contains(t, b.String(), `<testcase name="harness"`)
	assert.Contains(t, b.String(), `failures="1"`)
}

// refuseAll starts servers that answer 400 to every request.
type refuseAll struct{}

func (refuseAll) Profile() targets.Profile { return targets.Profile{} }
func (refuseAll) Start(string) (targets.Server, error) {
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

// TestDurationsInMilliseconds: a saved failure gives its durations in
// milliseconds, as the rest of the JSON does, reads back the same, and a
// failure saved under schema v1 (nanoseconds) still reads.
func TestDurationsInMilliseconds(t *testing.T) {
	f := &report.Failure{FoundIn: 1500 * time.Millisecond, ShrunkIn: 250 * time.Millisecond, Seed: 7}
	var b strings.Builder
	require.NoError(t, report.NewReport(&report.Result{Seed: 7, Elapsed: 2 * time.Second, Failure: f}, targets.ServerSpec{Kind: "go"}).WriteJSON(&b))
	assert.Contains(t, b.String(), `"foundInMs": 1500`)
	assert.Contains(t, b.String(), `"shrunkInMs": 250`)
	assert.Contains(t, b.String(), `"elapsedMs": 2000`)
	assert.NotContains(t, b.String(), "Ns\"")

	path := filepath.Join(t.TempDir(), "r.json")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	back, err := report.ReadReport(path)
	require.NoError(t, err)
	assert.Equal(t, f.FoundIn, back.Failure.FoundIn)
	assert.Equal(t, f.ShrunkIn, back.Failure.ShrunkIn)

	v1 := `{"schema": "turncheck/report/v1", "verdict": "fail", "failure": {"seed": 7, "foundInNs": 1500000000, "shrunkInNs": 250000000}}`
	require.NoError(t, os.WriteFile(path, []byte(v1), 0o644))
	back, err = report.ReadReport(path)
	require.NoError(t, err)
	assert.Equal(t, f.FoundIn, back.Failure.FoundIn)
	assert.Equal(t, f.ShrunkIn, back.Failure.ShrunkIn)

	var c strings.Builder
	require.NoError(t, (&report.Conformance{Elapsed: 3 * time.Second}).WriteJSON(&c))
	assert.Contains(t, c.String(), `"elapsedMs": 3000`)
	assert.NotContains(t, c.String(), "Ns\"")
}
