package cmd

import (
	"bytes"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolveBuildInfo(t *testing.T) {
	vcs := func(rev, time string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: time}}
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		desc    string
		stamped buildInfo
		bi      *debug.BuildInfo
		want    buildInfo
	}{
		{
			desc:    "release build: the stamps win over what Go recorded",
			stamped: buildInfo{Version: "1.2.3", Commit: "abc", Date: "2026-01-02T03:04:05Z"},
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs("def", "2025-01-01T00:00:00Z")},
			want:    buildInfo{Version: "1.2.3", Commit: "abc", Date: "2026-01-02T03:04:05Z", GoVersion: "go1.26.8", Platform: platform},
		},
		{
			desc: "go install module@v1.2.3: the module version, no vcs",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.2.3"}},
			want: buildInfo{Version: "1.2.3", GoVersion: "go1.26.1", Platform: platform},
		},
		{
			desc: "go install of a pseudo-version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v0.0.0-20261123014600-2fbdbc4c1f2e"}},
			want: buildInfo{Version: "0.0.0-20261123014600-2fbdbc4c1f2e", GoVersion: "go1.26.1", Platform: platform},
		},
		{
			desc: "go build in a checkout: dev, with the revision and its time",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: vcs("def", "2025-01-01T00:00:00Z")},
			want: buildInfo{Version: "dev", Commit: "def", Date: "2025-01-01T00:00:00Z", GoVersion: "go1.26.8", Platform: platform},
		},
		{
			desc:    "make build from git describe: the v goes",
			stamped: buildInfo{Version: "v1.2.3-4-gabcdef0"},
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			want:    buildInfo{Version: "1.2.3-4-gabcdef0", GoVersion: "go1.26.8", Platform: platform},
		},
		{
			desc:    "a version that is a commit hash keeps its first letter",
			stamped: buildInfo{Version: "v2fbdbc4"},
			want:    buildInfo{Version: "2fbdbc4", GoVersion: runtime.Version(), Platform: platform},
		},
		{
			desc:    "not a v-number",
			stamped: buildInfo{Version: "vendored"},
			want:    buildInfo{Version: "vendored", GoVersion: runtime.Version(), Platform: platform},
		},
		{
			desc: "no build info at all",
			want: buildInfo{Version: "dev", GoVersion: runtime.Version(), Platform: platform},
		},
	} {
		if got := resolveBuildInfo(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.desc, got, tc.want)
		}
	}
}

func TestVersionOutput(t *testing.T) {
	info := buildInfo{Version: "1.2.3", Commit: "abc", GoVersion: "go1.26.8", Platform: "linux/arm64"}
	want := "withlock 1.2.3\ncommit:  abc\nbuilt:   unknown\ngo:      go1.26.8 linux/arm64\n"
	if got := info.text(); got != want {
		t.Errorf("text:\n got %q\nwant %q", got, want)
	}
	b, err := json.Marshal(info.object())
	if err != nil {
		t.Fatal(err)
	}
	wantJSON := `{"version":"1.2.3","commit":"abc","build_date":null,"go_version":"go1.26.8","platform":"linux/arm64"}`
	if string(b) != wantJSON {
		t.Errorf("json:\n got %s\nwant %s", b, wantJSON)
	}
}

// The command, --version and --json print this binary's own build info.
func TestVersionCommand(t *testing.T) {
	want := readBuildInfo()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 || stdout.String() != want.text() || stderr.Len() > 0 {
			t.Errorf("withlock %s: exit %d, stdout %q, stderr %q; want 0, %q", strings.Join(args, " "), code, stdout.String(), stderr.String(), want.text())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("withlock version --json: exit %d, stderr %q", code, stderr.String())
	}
	var got versionObject
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("withlock version --json: %v", err)
	}
	if got.Version != want.Version || got.GoVersion != runtime.Version() || got.Platform != want.Platform {
		t.Errorf("withlock version --json = %+v; want version %q, go_version %q, platform %q", got, want.Version, runtime.Version(), want.Platform)
	}
}
