package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The withlock binary links neither gRPC, protobuf, zap nor the official
// etcd client: Go initialises every linked package at start-up, so theirs
// would run in every withlock process, whatever its backend (docs/design.md,
// "etcd and Kubernetes: clients of our own"). Tests and test servers may use them.
func TestNoHeavyDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range []string{"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto", "github.com/grpc-ecosystem/", "go.uber.org/zap", "go.etcd.io/"} {
			if strings.HasPrefix(pkg, heavy) {
				t.Errorf("withlock links %s", pkg)
			}
		}
	}
}

// Nothing in withlock calls a method by a name known only at run time
// (reflect's Method or MethodByName, as text/template does): the linker
// would then keep every exported method of every type that reaches an
// interface, which was 9 MB of the binary (go-redis's hundreds of commands
// among them) and page faults in every start. cobra runs a template only
// for a custom template text (SetVersionTemplate and the like).
func TestMethodsPrunedByLinker(t *testing.T) {
	out, err := exec.Command("go", "build", "-ldflags=-dumpdep", "-o", "/dev/null", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -ldflags=-dumpdep: %v\n%.2000s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "<ReflectMethod>") {
			t.Errorf("the linker keeps every method, because of: %s", line)
		}
	}
}
