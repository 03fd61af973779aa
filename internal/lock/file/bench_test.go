package file_test

import (
	"context"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/file"
)

func BenchmarkFileName(b *testing.B) {
	for b.Loop() {
		file.FileName("reports/nightly run #42")
	}
}

// BenchmarkRoundTrip is one acquire and release of a lock file.
func BenchmarkRoundTrip(b *testing.B) {
	bk, err := lock.Open("file://"+b.TempDir(), lock.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bk.Close()
	for b.Loop() {
		l, err := bk.TryAcquire(context.Background(), "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
