package scenarios

import (
	"net/http"

	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// The targets and profiles of package targets, named here too, so that a
// caller of Run, Check or Conform needs this package alone.
type (
	// Target starts the servers a run checks (targets.Target).
	Target = targets.Target
	// Server is a running server under test (targets.Server).
	Server = targets.Server
	// Profile says how a server is reached and what it declares
	// (targets.Profile).
	Profile = targets.Profile
	// Remote is a server someone else started (targets.Remote).
	Remote = targets.Remote
	// Subprocess is a server the harness starts as a process
	// (targets.Subprocess).
	Subprocess = targets.Subprocess
	// Durability is what a server declares survives (targets.Durability).
	Durability = targets.Durability
	// Interruption is a server's interruption policy
	// (targets.Interruption).
	Interruption = targets.Interruption
	// Eviction is a server's eviction policy (targets.Eviction).
	Eviction = targets.Eviction
	// ServerSpec says which server a report is about (targets.ServerSpec).
	ServerSpec = targets.ServerSpec
	// Restarter is a Server the harness can restart (targets.Restarter).
	Restarter = targets.Restarter
	// DeadlineController is a Server whose model-call deadlines the harness
	// can set (targets.DeadlineController).
	DeadlineController = targets.DeadlineController
	// ActivityReporter is a Server that reports when it is at rest
	// (targets.ActivityReporter).
	ActivityReporter = targets.ActivityReporter
	// ServerReuser is a Target whose server may serve a whole run
	// (targets.ServerReuser).
	ServerReuser = targets.ServerReuser
	// ModelAddresser is a Target whose fake model listens at a fixed
	// address (targets.ModelAddresser).
	ModelAddresser = targets.ModelAddresser
	// Specifier is a Target that says which server it starts
	// (targets.Specifier).
	Specifier = targets.Specifier
)

// The policies a profile declares.
const (
	Rollback       = targets.Rollback
	KeepConsistent = targets.KeepConsistent
	Complete       = targets.Complete
	Durable        = targets.Durable
	Forgets        = targets.Forgets
)

// DefaultConversationHeader is the header that names a conversation when a
// profile names none.
const DefaultConversationHeader = targets.DefaultConversationHeader

// LoadProfile reads a profile file (targets.LoadProfile).
func LoadProfile(path string) (Target, error) { return targets.LoadProfile(path) }

// ParseProfile reads a profile from YAML (targets.ParseProfile).
func ParseProfile(data []byte) (Target, error) { return targets.ParseProfile(data) }

// Handler is a target that serves an http.Handler on loopback
// (targets.Handler).
func Handler(p Profile, newHandler func(modelURL, dataDir string) (http.Handler, error)) Target {
	return targets.Handler(p, newHandler)
}

// AgentRefs are the agent references a server loads at its first start
// (targets.AgentRefs).
func AgentRefs(modelURL, agent string) []string { return targets.AgentRefs(modelURL, agent) }

// What a run found, as package report keeps it, named here too.
type (
	// Result is what a Check found (report.Result).
	Result = report.Result
	// Failure is a broken invariant, shrunk (report.Failure).
	Failure = report.Failure
	// Stats counts what a run did (report.Stats).
	Stats = report.Stats
	// ShrinkState is how far a failure's shrinking got
	// (report.ShrinkState).
	ShrinkState = report.ShrinkState
	// Conformance is a Conform's verdicts (report.Conformance).
	Conformance = report.Conformance
	// Verdict is one invariant's verdict (report.Verdict).
	Verdict = report.Verdict
	// Status is a verdict's kind (report.Status).
	Status = report.Status
)

// The shrink states and the verdicts' statuses.
const (
	Shrunk        = report.Shrunk
	PartlyShrunk  = report.PartlyShrunk
	NotShrunk     = report.NotShrunk
	Pass          = report.Pass
	Fail          = report.Fail
	NotApplicable = report.NotApplicable
	NotExercised  = report.NotExercised
	Skipped       = report.Skipped
	SameCause     = report.SameCause
)
