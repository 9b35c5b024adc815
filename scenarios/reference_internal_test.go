package scenarios

import (
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// Reference is the reference server for the tests inside package
// scenarios, which cannot import package reference (it imports this
// one): each call goes to the reference.Target that ReferenceTarget
// makes of it.
type Reference struct {
	Mutant       sut.Mutant
	Concurrency  sut.Concurrency
	Interruption sut.Interruption
}

// ReferenceTarget makes a reference.Target of r. It is set by
// reference_link_test.go, a test of package scenarios_test, which can
// import package reference and shares this test binary.
var ReferenceTarget func(r Reference) targets.Target

func (r Reference) Start(modelURL string) (targets.Server, error) {
	return ReferenceTarget(r).Start(modelURL)
}
func (r Reference) Profile() targets.Profile { return ReferenceTarget(r).Profile() }
func (r Reference) Spec() targets.ServerSpec { return ReferenceTarget(r).(targets.Specifier).Spec() }
