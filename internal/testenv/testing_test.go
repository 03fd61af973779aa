package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissingPolicy runs TestMissingChild in a child test binary that sees no
// PostgreSQL and no node, with and without CI=true.
func TestMissingPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary")
	}
	for _, tc := range []struct {
		ci   string
		want string
	}{
		{"", "--- SKIP: TestMissingChild"},
		{"false", "--- SKIP: TestMissingChild"},
		{"true", "--- FAIL: TestMissingChild"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_MISSING_CHILD=1", "CI="+tc.ci)
		out, _ := cmd.CombinedOutput()
		s := string(out)
		if !strings.Contains(s, tc.want) {
			t.Errorf("CI=%q: want %q in:\n%s", tc.ci, tc.want, s)
		}
		for _, hint := range []string{"apt-get install postgresql", "apt-get install nodejs npm"} {
			if !strings.Contains(s, hint) {
				t.Errorf("CI=%q: no hint %q in:\n%s", tc.ci, hint, s)
			}
		}
	}
}

func TestMissingChild(t *testing.T) {
	if os.Getenv("TESTENV_MISSING_CHILD") != "1" {
		t.Skip("run by TestMissingPolicy")
	}
	pgLibGlob = "/nonexistent/*/bin"
	t.Setenv("PATH", t.TempDir())
	t.Run("postgres", func(t *testing.T) { RequirePostgres(t) })
	t.Run("npm", func(t *testing.T) { RequireNPM(t) })
}
