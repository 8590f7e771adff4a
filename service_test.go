package dabb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb"
)

// TestRegisterServiceRejectsBadHandlerType: a ServiceDesc whose
// HandlerType is not a pointer to an interface is refused with an error
// naming the service and what HandlerType must be (docs/design.md:
// RegisterService returns errors instead of panicking); the server keeps
// nothing of it.
func TestRegisterServiceRejectsBadHandlerType(t *testing.T) {
	type notAnInterface struct{}
	for name, ht := range map[string]any{
		"pointer to a struct": (*notAnInterface)(nil),
		"not a pointer":       "test.Probe",
	} {
		t.Run(name, func(t *testing.T) {
			desc := dabb.ServiceDesc{
				Name:        "test.Bad",
				HandlerType: ht,
				Methods: []dabb.MethodDesc{{Name: "Do", Handler: func(any, context.Context, func(any) error) (any, error) {
					return nil, nil
				}}},
			}
			s := dabb.NewServer(dabb.WithLogger(quiet))
			defer s.Close()
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("RegisterService panicked: %v", v)
					}
				}()
				err = s.RegisterService(&desc, newProbe())
			}()
			if err == nil {
				t.Fatalf("RegisterService accepted HandlerType %T", ht)
			}
			for _, want := range []string{"test.Bad", "HandlerType", "pointer to the service interface"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("RegisterService = %q, want it to mention %q", err, want)
				}
			}
			// Nothing was kept: a correct description registers under the name.
			good := probeDesc
			good.Name = desc.Name
			if err := s.RegisterService(&good, newProbe()); err != nil {
				t.Errorf("RegisterService of a good description after the refused one: %v", err)
			}
		})
	}
}
