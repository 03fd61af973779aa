package main

import (
	"os/exec"
	"strings"
	"testing"
)

// Only the etcd backend links gRPC, protobuf, zap and the official etcd
// client, and nothing links client-go: Go initialises every linked package
// at start-up, so theirs run in every withlock process, whatever its
// backend (docs/design.md, "Clients"). The official etcd client is worth
// that; no other backend brings them in by another road. Tests and test
// servers may use them.
func TestNoHeavyDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	heavy := []string{"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto", "github.com/grpc-ecosystem/", "go.uber.org/zap", "go.etcd.io/"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := f[0]
		if strings.HasPrefix(pkg, "k8s.io/") {
			t.Errorf("withlock links %s", pkg)
		}
		if !strings.HasPrefix(pkg, "github.com/withlock/withlock") || pkg == "github.com/withlock/withlock/internal/lock/etcd" {
			continue
		}
		for _, imp := range f[1:] {
			for _, h := range heavy {
				if strings.HasPrefix(imp, h) {
					t.Errorf("%s imports %s: only the etcd backend may", pkg, imp)
				}
			}
		}
	}
}

// Nothing in withlock calls a method by a name known only at run time
// (reflect's Method or MethodByName, as text/template does): the linker
// would then keep every exported method of every type that reaches an
// interface, which was 9 MB of the binary (go-redis's hundreds of commands
// among them) and page faults in every start. cobra runs a template only
// for a custom template text (SetVersionTemplate and the like). protobuf
// before 1.36.12 asked for a method named Methods by name, which since Go
// 1.26 reaches reflect's method iterators and so did the same. Built as
// the Makefile builds it: without grpcnotrace, gRPC's request tracing
// brings in html/template.
func TestMethodsPrunedByLinker(t *testing.T) {
	out, err := exec.Command("go", "build", "-tags", "grpcnotrace", "-ldflags=-dumpdep", "-o", "/dev/null", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -ldflags=-dumpdep: %v\n%.2000s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "<ReflectMethod>") {
			t.Errorf("the linker keeps every method, because of: %s", line)
		}
	}
}
