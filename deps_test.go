package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The withlock binary links neither gRPC, protobuf, zap nor the official
// etcd client: Go initialises every linked package at start-up, so theirs
// would run in every withlock process, whatever its backend (README,
// Performance). Tests and test servers may use them.
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
