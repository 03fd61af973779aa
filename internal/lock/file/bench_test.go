package file_test

import (
	"testing"

	"github.com/withlock/withlock/internal/lock/file"
	"github.com/withlock/withlock/internal/lock/locktest"
)

func BenchmarkFileName(b *testing.B) {
	for b.Loop() {
		file.FileName("reports/nightly run #42")
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	locktest.BenchRoundTrip(b, "file://"+b.TempDir())
}
