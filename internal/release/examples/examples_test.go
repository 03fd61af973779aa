// Package examples tests the files in examples/: the Kubernetes manifests
// decode strictly into the real API types, the systemd units pass
// systemd-analyze verify, and every withlock command line in them runs,
// verbatim but for the lock's database (file://) and the job (a stub), with
// the behaviour its comments promise.
package examples

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/withlock/withlock/internal/testenv"
)

// dir is examples/ in this checkout.
var dir = filepath.Join("..", "..", "..", "examples")

// binDir holds the withlock binary that TestMain builds.
var binDir string

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "withlock-examples-"); err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(binDir, "withlock"), ".")
	build.Dir = filepath.Join("..", "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build withlock: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	os.RemoveAll(binDir)
	os.Exit(code)
}

// image is the name the examples give withlock's image: the reader's registry,
// where the image make dist builds is pushed.
const image = "registry.example.com/withlock:"

func TestKubernetesDeployment(t *testing.T) {
	var d appsv1.Deployment
	decodeStrict(t, "kubernetes/deployment.yaml", &d)
	if d.APIVersion != "apps/v1" || d.Kind != "Deployment" {
		t.Fatalf("%s %s; want apps/v1 Deployment", d.APIVersion, d.Kind)
	}
	pod := d.Spec.Template.Spec
	if len(pod.InitContainers) != 2 || !strings.HasPrefix(pod.InitContainers[1].Image, image) {
		t.Fatalf("want two init containers, the second from %s...: %+v", image, pod.InitContainers)
	}
	c := pod.InitContainers[1]
	checkWithlockContainer(t, pod, c)
	if len(c.Command) != 0 {
		t.Errorf("command %q overrides the image's entrypoint", c.Command)
	}

	// Every replica runs the init container at once: one migrates at a
	// time and each finds the migrations run.
	env := newJobEnv(t, "/shared/")
	runs := make([]*exec.Cmd, 4)
	for i := range runs {
		runs[i] = env.withlock(c.Args...)
	}
	env.runAll(t, runs)
	want := env.move("-path=/shared/migrations -database=$(DATABASE_URL) up")
	if got := env.jobRuns(); len(got) != len(runs) || got[0] != want {
		t.Errorf("migrate ran with %q; want %d times with %q", got, len(runs), want)
	}
}

func TestKubernetesCronJob(t *testing.T) {
	var cj batchv1.CronJob
	decodeStrict(t, "kubernetes/cronjob.yaml", &cj)
	if cj.APIVersion != "batch/v1" || cj.Kind != "CronJob" {
		t.Fatalf("%s %s; want batch/v1 CronJob", cj.APIVersion, cj.Kind)
	}
	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	if len(pod.Containers) != 1 || !strings.HasPrefix(pod.Containers[0].Image, image) {
		t.Fatalf("want one container, from %s...: %+v", image, pod.Containers)
	}
	c := pod.Containers[0]
	checkWithlockContainer(t, pod, c)
	for _, flag := range []string{"-n", "--conflict-exit-code=0", "--hold-at-least=10m"} {
		if !slices.Contains(c.Args, flag) {
			t.Errorf("args %q lack %s", c.Args, flag)
		}
	}
	env := newJobEnv(t, "/shared/")
	env.checkOncePerSlot(t, func() *exec.Cmd { return env.withlock(c.Args...) })
}

// TestKubernetesLease: the init-container example that keeps the lock in a
// Lease: the ServiceAccount, the least Role (leases in one namespace, no
// delete) bound to it, and a Job whose pod runs as that account with an
// init container that takes the lock on k8s://. The command line runs as
// the others do, on file:// (the k8s scripts of the main module run the
// same Role against a real API server).
func TestKubernetesLease(t *testing.T) {
	var job batchv1.Job
	sa := decodeLeaseManifest(t, "lease-migration.yaml", &job)
	if job.Kind != "Job" {
		t.Fatalf("the fourth document is a %s; want a Job", job.Kind)
	}
	if job.Namespace != sa.Namespace {
		t.Errorf("the Job is in %q, the ServiceAccount in %q; want one namespace", job.Namespace, sa.Namespace)
	}
	pod := job.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("the pod runs as %q, not the ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	if len(pod.InitContainers) != 2 || !strings.HasPrefix(pod.InitContainers[1].Image, image) {
		t.Fatalf("want two init containers, the second from %s...", image)
	}
	c := pod.InitContainers[1]
	if len(c.Command) != 0 || !slices.Contains(c.Args, "--db=k8s://") {
		t.Errorf("the init container's args %q: want withlock's entrypoint with --db=k8s://", c.Args)
	}
	env := newJobEnv(t, "/shared/")
	args := slices.Clone(c.Args)
	args[slices.Index(args, "--db=k8s://")] = "--db=file://" + filepath.Join(env.dir, "locks")
	runs := make([]*exec.Cmd, 4)
	for i := range runs {
		runs[i] = env.withlock(args...)
	}
	env.runAll(t, runs)
	want := env.move("-path=/shared/migrations -database=$(DATABASE_URL) up")
	if got := env.jobRuns(); len(got) != len(runs) || got[0] != want {
		t.Errorf("migrate ran with %q; want %d times with %q", got, len(runs), want)
	}
}

// TestKubernetesLeaseCronJob: the cron pattern with the lock in a Lease:
// the same ServiceAccount, Role and RoleBinding as the init-container
// example, and a CronJob whose pod runs as that account with withlock on
// k8s://, -n, --conflict-exit-code 0 and --hold-at-least. The command line
// runs as the others do, on file:// (the main module's k8s scripts run the
// cron pattern over three slots against a real API server).
func TestKubernetesLeaseCronJob(t *testing.T) {
	var cj batchv1.CronJob
	sa := decodeLeaseManifest(t, "lease-cronjob.yaml", &cj)
	if cj.APIVersion != "batch/v1" || cj.Kind != "CronJob" {
		t.Fatalf("%s %s; want batch/v1 CronJob", cj.APIVersion, cj.Kind)
	}
	if cj.Namespace != sa.Namespace {
		t.Errorf("the CronJob is in %q, the ServiceAccount in %q; want one namespace", cj.Namespace, sa.Namespace)
	}
	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("the pod runs as %q, not the ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	if len(pod.Containers) != 1 || !strings.HasPrefix(pod.Containers[0].Image, image) {
		t.Fatalf("want one container, from %s...: %+v", image, pod.Containers)
	}
	c := pod.Containers[0]
	checkWithlockContainer(t, pod, c)
	for _, flag := range []string{"--db=k8s://", "-n", "--conflict-exit-code=0", "--hold-at-least=10m"} {
		if !slices.Contains(c.Args, flag) {
			t.Errorf("args %q lack %s", c.Args, flag)
		}
	}
	env := newJobEnv(t, "/shared/")
	args := slices.Clone(c.Args)
	args[slices.Index(args, "--db=k8s://")] = "--db=file://" + filepath.Join(env.dir, "locks")
	env.checkOncePerSlot(t, func() *exec.Cmd { return env.withlock(args...) })
}

// decodeLeaseManifest decodes examples/kubernetes/name: a ServiceAccount, a
// Role that allows what withlock needs on Leases and nothing else, a
// RoleBinding of it to the account, all in one namespace, and a workload
// (the fourth document) into workload. It returns the ServiceAccount.
func decodeLeaseManifest(t *testing.T, name string, workload any) corev1.ServiceAccount {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kubernetes", name))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 4 {
		t.Fatalf("%d documents; want ServiceAccount, Role, RoleBinding and the workload", len(docs))
	}
	var (
		sa   corev1.ServiceAccount
		role rbacv1.Role
		rb   rbacv1.RoleBinding
	)
	for i, v := range []any{&sa, &role, &rb, workload} {
		if err := yaml.UnmarshalStrict([]byte(docs[i]), v); err != nil {
			t.Fatalf("document %d: %v", i+1, err)
		}
	}
	if sa.Kind != "ServiceAccount" || role.Kind != "Role" || rb.Kind != "RoleBinding" {
		t.Fatalf("kinds %s, %s, %s", sa.Kind, role.Kind, rb.Kind)
	}
	ns := sa.Namespace
	if role.Namespace != ns || rb.Namespace != ns {
		t.Errorf("namespaces %q %q %q; want one", ns, role.Namespace, rb.Namespace)
	}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].APIGroups, []string{"coordination.k8s.io"}) ||
		!slices.Equal(role.Rules[0].Resources, []string{"leases"}) ||
		!slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "watch", "create", "update"}) {
		t.Errorf("Role rules %+v; want get, list, watch, create, update on leases only", role.Rules)
	}
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Name || rb.Subjects[0].Namespace != ns {
		t.Errorf("RoleBinding %+v does not bind the Role to the ServiceAccount", rb)
	}
	return sa
}

// checkWithlockContainer checks what withlock's image needs: a non-root
// user the kubelet can verify, the database's URL from a Secret (unless the
// lock is in a Lease), and the shared volume with the job in it.
func checkWithlockContainer(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("the pod does not ask for runAsNonRoot")
	}
	if c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil || *c.SecurityContext.RunAsUser != 65532 {
		t.Errorf("container %s: runAsUser is not the image's user 65532", c.Name)
	}
	var db bool
	for _, e := range c.Env {
		db = db || e.Name == "WITHLOCK_DB" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
	}
	if !db && !slices.Contains(c.Args, "--db=k8s://") {
		t.Errorf("container %s: WITHLOCK_DB does not come from a Secret, and the lock is not in a Lease (--db=k8s://)", c.Name)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/shared" {
		t.Errorf("container %s: want /shared mounted, have %+v", c.Name, c.VolumeMounts)
	}
	if len(pod.Volumes) != 1 || pod.Volumes[0].EmptyDir == nil || pod.Volumes[0].Name != c.VolumeMounts[0].Name {
		t.Errorf("want one emptyDir volume, the one mounted: %+v", pod.Volumes)
	}
}

// decodeStrict decodes examples/name into v as the API server would, but
// failing on any field v's type does not have, and on duplicate fields.
func decodeStrict(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestCrontab(t *testing.T) {
	f, err := os.Open(filepath.Join(dir, "cron", "withlock-report"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vars []string
	var jobs [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#':
		case strings.Contains(strings.Fields(line)[0], "="):
			vars = append(vars, line)
		default:
			// minute hour day month weekday user command (/etc/cron.d)
			fields := strings.SplitN(line, " ", 7)
			if len(fields) != 7 {
				t.Fatalf("cron line %q: want 5 time fields, a user and a command", line)
			}
			jobs = append(jobs, fields)
		}
	}
	if len(jobs) != 1 || len(vars) != 1 || !strings.HasPrefix(vars[0], "WITHLOCK_DB=") {
		t.Fatalf("want WITHLOCK_DB= and one job: %q, %q", vars, jobs)
	}
	if jobs[0][5] != "report" {
		t.Errorf("the job runs as %q; want the report user", jobs[0][5])
	}
	// cron runs the command with /bin/sh -c.
	env := newJobEnv(t, "/opt/report/")
	env.checkOncePerSlot(t, func() *exec.Cmd { return env.shell(jobs[0][6]) })
}

func TestSystemdUnits(t *testing.T) {
	service, err := os.ReadFile(filepath.Join(dir, "systemd", "report.service"))
	if err != nil {
		t.Fatal(err)
	}
	var execStart, killMode string
	for _, line := range strings.Split(string(service), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = v
		}
		if v, ok := strings.CutPrefix(line, "KillMode="); ok {
			killMode = v
		}
	}
	// withlock forwards TERM to the command; systemd's default KillMode
	// (control-group) would also send it to the command directly.
	if killMode != "mixed" {
		t.Errorf("KillMode=%q; want mixed, so that on stop the command gets TERM once, from withlock", killMode)
	}
	if execStart == "" || strings.ContainsAny(execStart, `"'$%\`) {
		t.Fatalf("ExecStart=%q: want one, without quoting or expansion (systemd's rules differ from sh's)", execStart)
	}

	t.Run("verify", func(t *testing.T) {
		analyze, err := exec.LookPath("systemd-analyze")
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("systemd-analyze not found: apt-get install systemd")
			}
			t.Skip("systemd-analyze not found: apt-get install systemd")
		}
		// A root with the units where systemd looks, beside the system's
		// own (timers.target, sysinit.target), and the programs ExecStart
		// names, which verify checks are executable.
		root := t.TempDir()
		units := filepath.Join(root, "etc", "systemd", "system")
		system := filepath.Join(root, "usr", "lib", "systemd")
		if err := os.MkdirAll(system, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", system).CombinedOutput(); err != nil {
			t.Fatalf("copying the system's units: %v\n%s", err, out)
		}
		for _, name := range []string{"report.service", "report.timer"} {
			copyFile(t, filepath.Join(dir, "systemd", name), filepath.Join(units, name), 0o644)
		}
		copyFile(t, filepath.Join(binDir, "withlock"), filepath.Join(root, "usr", "bin", "withlock"), 0o755)
		writeFile(t, filepath.Join(root, "opt", "report", "send-report"), "#!/bin/sh\n", 0o755)
		cmd := exec.Command(analyze, "verify", "--man=no", "--root="+root,
			filepath.Join(units, "report.service"), filepath.Join(units, "report.timer"))
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})

	t.Run("ExecStart", func(t *testing.T) {
		argv := strings.Fields(execStart)
		if argv[0] != "/usr/bin/withlock" {
			t.Fatalf("ExecStart runs %s; the packages install /usr/bin/withlock", argv[0])
		}
		env := newJobEnv(t, "/opt/report/")
		env.checkOncePerSlot(t, func() *exec.Cmd { return env.withlock(argv[1:]...) })
	})
}

func TestDeployScript(t *testing.T) {
	env := newJobEnv(t, "")
	// The script's commands, as stubs: migrate is the job; systemctl
	// records what it was asked.
	writeFile(t, filepath.Join(env.dir, "bin", "migrate"), env.stub, 0o755)
	writeFile(t, filepath.Join(env.dir, "bin", "systemctl"), `#!/bin/sh
echo "$*" >>"$STATE/systemctl"
`, 0o755)
	script, err := filepath.Abs(filepath.Join(dir, "deploy", "deploy.sh"))
	if err != nil {
		t.Fatal(err)
	}
	runs := make([]*exec.Cmd, 4) // four hosts deploy at once
	for i := range runs {
		runs[i] = env.command(script)
	}
	env.runAll(t, runs)
	if got := env.jobRuns(); len(got) != len(runs) || got[0] != "up" {
		t.Errorf("migrate ran with %q; want %d times with %q", got, len(runs), "up")
	}
	if got, _ := os.ReadFile(filepath.Join(env.dir, "systemctl")); string(got) != strings.Repeat("restart shop\n", len(runs)) {
		t.Errorf("systemctl was run with %q; want restart shop, once per host", got)
	}
}

// jobEnv runs withlock command lines with the lock in a directory of the
// test's own (file://), PATH holding withlock and the stubs, and every
// absolute path under prefix moved to the test's directory, where the job
// stub stands in for the example's job.
type jobEnv struct {
	dir    string // $STATE: the stubs' records, and the job under prefix's name
	db     string // $WITHLOCK_DB
	prefix string
	stub   string // the job stub's script
	vars   []string
}

func newJobEnv(t *testing.T, prefix string) *jobEnv {
	e := &jobEnv{dir: t.TempDir(), prefix: prefix}
	// The job records its arguments, and exits 99 if another copy of it is
	// running: mkdir is atomic. It stays a moment so that an overlap, if
	// withlock allowed one, would happen: a sleep that checks that
	// something does not happen.
	e.stub = `#!/bin/sh
mkdir "$STATE/running" 2>/dev/null || { echo "job: another copy is running" >&2; exit 99; }
echo "$*" >>"$STATE/runs"
sleep 0.2
rmdir "$STATE/running"
`
	if prefix != "" {
		for _, name := range []string{"migrate", "send-report"} {
			writeFile(t, filepath.Join(e.dir, name), e.stub, 0o755)
		}
	}
	e.vars = []string{
		"PATH=" + binDir + string(os.PathListSeparator) + filepath.Join(e.dir, "bin") + string(os.PathListSeparator) + "/usr/bin:/bin",
		"STATE=" + e.dir,
	}
	e.useDB("file://" + filepath.Join(e.dir, "locks"))
	return e
}

// useDB makes url the lock's database ($WITHLOCK_DB).
func (e *jobEnv) useDB(url string) {
	e.db = url
	e.vars = append(slices.DeleteFunc(e.vars, func(v string) bool { return strings.HasPrefix(v, "WITHLOCK_DB=") }), "WITHLOCK_DB="+url)
}

// move rewrites the example's paths under prefix to the test's directory.
func (e *jobEnv) move(s string) string {
	if e.prefix == "" {
		return s
	}
	return strings.ReplaceAll(s, e.prefix, e.dir+"/")
}

func (e *jobEnv) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = e.vars
	cmd.Dir = e.dir
	// A group of its own, so that the test can stop withlock even when a
	// shell started it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// withlock runs withlock with the example's arguments, as a container's
// entrypoint or systemd would: no shell.
func (e *jobEnv) withlock(args ...string) *exec.Cmd {
	moved := make([]string, len(args))
	for i, a := range args {
		moved[i] = e.move(a)
	}
	return e.command(filepath.Join(binDir, "withlock"), moved...)
}

// shell runs a command line as cron does.
func (e *jobEnv) shell(line string) *exec.Cmd {
	return e.command("/bin/sh", "-c", e.move(line))
}

// runAll starts every command at once and wants each to succeed.
func (e *jobEnv) runAll(t *testing.T, cmds []*exec.Cmd) {
	t.Helper()
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, len(cmds))
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v\n%s", cmds[i].Args, err, &outs[i])
		}
	}
}

// jobRuns are the job's argument lists, one per run.
func (e *jobEnv) jobRuns() []string {
	data, _ := os.ReadFile(filepath.Join(e.dir, "runs"))
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// checkOncePerSlot checks the cron pattern: the first run runs the job and
// keeps the lock for --hold-at-least; a second run meanwhile (another host
// whose clock is late) exits 0 at once, quietly, without running the job.
func (e *jobEnv) checkOncePerSlot(t *testing.T, run func() *exec.Cmd) {
	t.Helper()
	first := run()
	var firstOut bytes.Buffer
	first.Stdout, first.Stderr = &firstOut, &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-first.Process.Pid, syscall.SIGTERM)
		<-firstDone
	})

	// The job has run once the stub recorded it and removed its marker.
	deadline := time.Now().Add(30 * time.Second)
	for {
		runs, _ := os.ReadFile(filepath.Join(e.dir, "runs"))
		_, err := os.Stat(filepath.Join(e.dir, "running"))
		if len(runs) > 0 && errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case err := <-firstDone:
			t.Fatalf("first run ended before its job was recorded: %v\n%s", err, &firstOut)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not run within 30s\n%s", &firstOut)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-firstDone:
		t.Fatalf("first run ended (%v) right after its job: --hold-at-least did not hold the lock\n%s", err, &firstOut)
	default:
	}

	second := run()
	start := time.Now()
	out, err := second.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("second run: %v, output %q; want exit 0 and no output", err, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("second run took %v; want it to give up at once", d)
	}
	if got := e.jobRuns(); len(got) != 1 {
		t.Errorf("the job ran %d times: %q; want once", len(got), got)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(data), mode)
}

func writeFile(t *testing.T, name, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// stepStub is a pipeline step: it records "$RUN name" when it starts and
// when it ends, stays a moment (so that two runs that overlapped would
// interleave their records), and exits $FAIL_<name> if set (its name's
// dots and dashes as underscores).
const stepStub = `#!/bin/sh
name=$(basename "$0")
echo "$RUN $name start" >>"$STATE/log"
sleep 0.2
echo "$RUN $name end" >>"$STATE/log"
code=$(printenv "FAIL_$(echo "$name" | tr .- __)" || true)
exit "${code:-0}"
`

// newStepsEnv is a jobEnv whose directory holds the example's steps as
// stubs, for pipelines whose runs are told apart by $RUN.
func newStepsEnv(t *testing.T, steps ...string) *jobEnv {
	env := newJobEnv(t, "")
	for _, s := range steps {
		writeFile(t, filepath.Join(env.dir, s), stepStub, 0o755)
	}
	return env
}

// runsApart checks that the runs' steps did not interleave: each run's
// records come together, in the order of steps.
func (e *jobEnv) runsApart(t *testing.T, runs []string, steps ...string) {
	t.Helper()
	data, _ := os.ReadFile(filepath.Join(e.dir, "log"))
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	per := 2 * len(steps)
	if len(lines) != per*len(runs) {
		t.Fatalf("the steps' records: %q; want %d runs of %q", lines, len(runs), steps)
	}
	for i := 0; i < len(lines); i += per {
		run := strings.Fields(lines[i])[0]
		for j, s := range steps {
			for k, what := range []string{"start", "end"} {
				if want := run + " " + s + " " + what; lines[i+2*j+k] != want {
					t.Fatalf("the steps' records: %q; at %d want %q: two runs overlapped", lines, i+2*j+k, want)
				}
			}
		}
	}
}

// free checks that NAME is free: withlock -n takes it.
func (e *jobEnv) free(t *testing.T, name string) {
	t.Helper()
	if out, err := e.withlock("--timeout", "10s", name, "--", "true").CombinedOutput(); err != nil {
		t.Errorf("%s is still held after the run: %v\n%s", name, err, out)
	}
}

// pipelineStep runs one step's shell script as a CI runner does: its
// stdout and stderr on pipes, read to EOF. A step that leaves a process
// holding them (a keeper that did not let go) fails the test: a runner
// would wait for it.
func (e *jobEnv) pipelineStep(t *testing.T, vars []string, shell ...string) error {
	t.Helper()
	cmd := e.command(shell[0], shell[1:]...)
	cmd.Env = append(slices.Clone(e.vars), vars...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		t.Errorf("%q: its stdout or stderr still open 10s after it exited\n%s", shell, &out)
	}
	if err != nil {
		t.Logf("%q: %v\n%s", shell, err, &out)
	}
	return err
}

// runTwice runs A and B at once, and wants each to succeed.
func runTwice(t *testing.T, run func(name string) bool) {
	t.Helper()
	var wg sync.WaitGroup
	for _, name := range []string{"A", "B"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !run(name) {
				t.Errorf("run %s failed", name)
			}
		}()
	}
	wg.Wait()
}

// workflow is the part of a GitHub Actions workflow that the test runs.
type workflow struct {
	Jobs map[string]struct {
		Needs   any               `json:"needs"` // a job's name, or a list of them
		If      string            `json:"if"`
		Env     map[string]string `json:"env"`
		Outputs map[string]string `json:"outputs"`
		Steps   []struct {
			ID   string `json:"id"`
			If   string `json:"if"`
			Uses string `json:"uses"`
			Run  string `json:"run"`
		} `json:"steps"`
	} `json:"jobs"`
}

// needs lists the jobs that job waits for.
func (wf workflow) needs(job string) []string {
	switch n := wf.Jobs[job].Needs.(type) {
	case string:
		return []string{n}
	case []any:
		var names []string
		for _, v := range n {
			names = append(names, fmt.Sprint(v))
		}
		return names
	}
	return nil
}

// runs reports whether a step or job whose if is cond runs, given whether
// all went well before it and the values of the expressions known: only
// always() runs after a failure, and an output named in cond must be set.
func runs(cond string, ok bool, values map[string]string) bool {
	run := ok || strings.Contains(cond, "always()")
	for _, f := range strings.Fields(strings.NewReplacer("&&", " ", "(", " ", ")", " ").Replace(cond)) {
		if strings.HasPrefix(f, "steps.") || strings.HasPrefix(f, "needs.") {
			run = run && values[f] != ""
		}
	}
	return run
}

// runWorkflow runs the workflow's jobs as GitHub would, each once the jobs
// it needs have ended (a job whose needs failed is skipped unless its if
// says always()); each run step a bash script of its own (bash -e, with
// $GITHUB_OUTPUT), the next ones skipped once one fails unless their if
// says always(); uses steps skipped; an if that names an output skipped
// while it is empty. Jobs pass outputs on through needs. It reports
// whether every job that ran succeeded.
func runWorkflow(t *testing.T, e *jobEnv, wf workflow, run string, vars ...string) bool {
	t.Helper()
	values := map[string]string{} // "steps.ID.outputs.KEY", "needs.JOB.outputs.KEY": value
	expand := func(s string) string {
		s = strings.ReplaceAll(s, "${{ secrets.WITHLOCK_DB }}", e.db)
		for k, v := range values {
			s = strings.ReplaceAll(s, "${{ "+k+" }}", v)
		}
		return s
	}
	allOK, done, failed := true, map[string]bool{}, map[string]bool{}
	for len(done) < len(wf.Jobs) {
		progress := false
		for name, job := range wf.Jobs {
			ready, needsOK := !done[name], true
			for _, n := range wf.needs(name) {
				ready = ready && done[n]
				needsOK = needsOK && !failed[n]
			}
			if !ready {
				continue
			}
			done[name], progress = true, true
			if !runs(job.If, needsOK, values) {
				failed[name] = !needsOK
				continue
			}
			for k := range values {
				if strings.HasPrefix(k, "steps.") {
					delete(values, k)
				}
			}
			env := append([]string{"RUN=" + run}, vars...)
			for k, v := range job.Env {
				env = append(env, k+"="+expand(v))
			}
			ok := true
			for _, step := range job.Steps {
				if step.Uses != "" || !runs(step.If, ok, values) {
					continue
				}
				dir := t.TempDir()
				script, output := filepath.Join(dir, "step.sh"), filepath.Join(dir, "output")
				writeFile(t, script, expand(step.Run), 0o644)
				writeFile(t, output, "", 0o644)
				if err := e.pipelineStep(t, append(env, "GITHUB_OUTPUT="+output), "bash", "--noprofile", "--norc", "-eo", "pipefail", script); err != nil {
					ok = false
				}
				data, _ := os.ReadFile(output)
				for _, line := range strings.Split(string(data), "\n") {
					if k, v, found := strings.Cut(line, "="); found && step.ID != "" {
						values["steps."+step.ID+".outputs."+k] = v
					}
				}
			}
			for k, v := range job.Outputs {
				values["needs."+name+".outputs."+k] = expand(v)
			}
			failed[name] = !ok
			allOK = allOK && ok
		}
		if !progress {
			t.Fatalf("the jobs' needs form a cycle, or name a job not there")
		}
	}
	return allOK
}

// readWorkflow reads a workflow of examples/ci. Not strictly: YAML 1.1
// reads the key "on" as true.
func readWorkflow(t *testing.T, name string) workflow {
	var wf workflow
	data, err := os.ReadFile(filepath.Join(dir, "ci", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &wf); err != nil {
		t.Fatal(err)
	}
	return wf
}

// TestGitHubActions: two runs of the workflow at once deploy one after the
// other, each step's output reaches EOF as the step ends, and the lock is
// free after each run; a run whose migration fails releases the lock in
// its always() step.
func TestGitHubActions(t *testing.T) {
	wf := readWorkflow(t, "github-actions.yml")
	if len(wf.Jobs) != 1 {
		t.Fatalf("%d jobs; want one", len(wf.Jobs))
	}
	checkDeployWorkflow(t, newStepsEnv(t, "migrate.sh", "deploy.sh"), wf)
}

// checkDeployWorkflow runs wf, a deploy in steps under deploy-prod, twice
// at once, and wants the runs one after the other and the lock free
// after; then once with a migration that fails, and wants the run to fail
// and the lock free.
func checkDeployWorkflow(t *testing.T, env *jobEnv, wf workflow) {
	t.Helper()
	runTwice(t, func(run string) bool { return runWorkflow(t, env, wf, run) })
	env.runsApart(t, []string{"A", "B"}, "migrate.sh", "deploy.sh")
	env.free(t, "deploy-prod")
	if runWorkflow(t, env, wf, "C", "FAIL_migrate_sh=3") {
		t.Error("a run whose migration failed succeeded")
	}
	env.free(t, "deploy-prod")
}

// TestGitHubActionsJobs: the workflow of three jobs, with a lease
// (Redis) that no process keeps between them: two runs at once deploy one
// after the other and leave the lock free; a run whose migration fails
// releases it in its always() job.
func TestGitHubActionsJobs(t *testing.T) {
	wf := readWorkflow(t, "github-actions-jobs.yml")
	env := newStepsEnv(t, "migrate.sh", "deploy.sh")
	env.useDB(testenv.RequireRedis(t).URL)
	checkDeployWorkflow(t, env, wf)
}

// TestGitLabCI: the job's script lines, run as GitLab runs them (one bash
// script, -e), by two jobs at once: they deploy one after the other; a job
// whose migration fails frees the lock as its shell ends.
func TestGitLabCI(t *testing.T) {
	var jobs map[string]struct {
		Stage  string   `json:"stage"`
		Script []string `json:"script"`
	}
	decodeStrict(t, "ci/gitlab-ci.yml", &jobs)
	script := strings.Join(jobs["deploy"].Script, "\n")
	if script == "" {
		t.Fatal("no deploy job with a script")
	}
	env := newStepsEnv(t, "migrate.sh", "deploy.sh")
	runTwice(t, func(run string) bool {
		return env.pipelineStep(t, []string{"RUN=" + run}, "bash", "-eo", "pipefail", "-c", script) == nil
	})
	env.runsApart(t, []string{"A", "B"}, "migrate.sh", "deploy.sh")
	env.free(t, "deploy-prod")

	if env.pipelineStep(t, []string{"RUN=C", "FAIL_migrate_sh=3"}, "bash", "-eo", "pipefail", "-c", script) == nil {
		t.Error("a job whose migration failed succeeded")
	}
	env.free(t, "deploy-prod")
}

// TestStepsScript: the shell script, run twice at once, runs its steps one
// run after the other; when a step fails the script ends and the keeper
// frees the lock (--until-pid $$).
func TestStepsScript(t *testing.T) {
	env := newStepsEnv(t, "extract.sh", "load.sh")
	script, err := filepath.Abs(filepath.Join(dir, "ci", "steps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	runTwice(t, func(run string) bool { return env.pipelineStep(t, []string{"RUN=" + run}, script) == nil })
	env.runsApart(t, []string{"A", "B"}, "extract.sh", "load.sh")
	env.free(t, "nightly-etl")

	if env.pipelineStep(t, []string{"RUN=C", "FAIL_extract_sh=3"}, script) == nil {
		t.Error("a run whose extract failed succeeded")
	}
	env.free(t, "nightly-etl")
}

// TestStepsDocQuotesExamples: docs/steps.md shows each CI example as it
// is in examples/ci, where the tests above run it.
func TestStepsDocQuotesExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(dir, "..", "docs", "steps.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"github-actions.yml", "github-actions-jobs.yml", "gitlab-ci.yml", "steps.sh"} {
		example, err := os.ReadFile(filepath.Join(dir, "ci", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(doc, append(append([]byte("\n"), example...), "```"...)) {
			t.Errorf("docs/steps.md does not show examples/ci/%s as it is, in a code block", name)
		}
	}
}
