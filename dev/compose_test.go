package dev

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// CI runs dev/stack, never docker-compose.yml (no Docker there), so nothing
// but these tests notices when the two drift apart: a compose stack on an
// older Kafka, or a PostgreSQL without the replication slots the tests use,
// would pass on a developer's machine what fails in CI, or the reverse.

// readVersions parses dev/versions: NAME=VALUE lines, comments and blank
// lines. It fails on anything else, since a quote or an expansion would mean
// one thing to bash and another here.
func readVersions(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("versions")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plain := regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=([A-Za-z0-9._-]+)$`)
	vs := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := plain.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("dev/versions:%d: %q is not a plain NAME=VALUE line", n, line)
		}
		if _, dup := vs[m[1]]; dup {
			t.Fatalf("dev/versions:%d: %s set twice", n, m[1])
		}
		vs[m[1]] = m[2]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return vs
}

func version(t *testing.T, vs map[string]string, name string) string {
	t.Helper()
	v, ok := vs[name]
	if !ok {
		t.Fatalf("dev/versions sets no %s", name)
	}
	return v
}

// pgMajors are the PostgreSQL majors dev/versions' PG_DIST_VERSION_<major>
// lines offer, ascending.
func pgMajors(t *testing.T, vs map[string]string) []int {
	t.Helper()
	var majors []int
	for name, full := range vs {
		m, ok := strings.CutPrefix(name, "PG_DIST_VERSION_")
		if !ok {
			continue
		}
		major, err := strconv.Atoi(m)
		if err != nil || !strings.HasPrefix(full, m+".") {
			t.Fatalf("dev/versions: %s=%s: want PG_DIST_VERSION_<major>=<major>.<minor>.<patch>", name, full)
		}
		majors = append(majors, major)
	}
	if len(majors) == 0 {
		t.Fatal("dev/versions sets no PG_DIST_VERSION_<major>")
	}
	sort.Ints(majors)
	return majors
}

// pgSettings parses dev/stack.d/postgres.conf, the settings pg-init appends
// (NAME = VALUE, a quoted value without its quotes).
func pgSettings(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("stack.d", "postgres.conf"))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{}
	for n, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("dev/stack.d/postgres.conf:%d: %q is not NAME = VALUE", n+1, line)
		}
		set[strings.TrimSpace(name)] = strings.Trim(strings.TrimSpace(value), "'")
	}
	return set
}

type composeFile struct {
	Services map[string]struct {
		Image       string         `yaml:"image"`
		Command     []string       `yaml:"command"`
		Environment map[string]any `yaml:"environment"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, s := range []string{"postgres", "kafka"} {
		if _, ok := c.Services[s]; !ok {
			t.Fatalf("docker-compose.yml has no %s service", s)
		}
	}
	return c
}

// imageTag is the tag of an image reference such as apache/kafka:4.1.1.
func imageTag(t *testing.T, image string) string {
	t.Helper()
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		t.Fatalf("docker-compose.yml: image %q has no tag", image)
	}
	return image[i+1:]
}

func TestComposeKafkaIsDevStacks(t *testing.T) {
	want := version(t, readVersions(t), "KAFKA_VERSION")
	image := readCompose(t).Services["kafka"].Image
	if !strings.HasPrefix(image, "apache/kafka:") || imageTag(t, image) != want {
		t.Errorf("docker-compose.yml's kafka runs %s; dev/versions' KAFKA_VERSION is %s: want apache/kafka:%s", image, want, want)
	}
}

// The compose stack runs the newest PostgreSQL major dev/stack runs (the one
// make test's PostgreSQL 17 group checks), so that a major added to
// dev/versions reaches docker-compose.yml too.
func TestComposePostgresMajorIsDevStacksNewest(t *testing.T) {
	majors := pgMajors(t, readVersions(t))
	newest := majors[len(majors)-1]
	image := readCompose(t).Services["postgres"].Image
	tag := imageTag(t, image)
	major, _, _ := strings.Cut(tag, ".")
	if !strings.HasPrefix(image, "postgres:") || major != strconv.Itoa(newest) {
		t.Errorf("docker-compose.yml's postgres runs %s; the newest major in dev/versions is %d (of %v): want postgres:%d", image, newest, majors, newest)
	}
}

// The compose postgres gets pg-init's settings as -c flags, all of them and
// no others: wal_level, the slots and walsenders, wal_sender_timeout, which
// outboxd's liveness checks are measured against, and the rest.
func TestComposePostgresSettingsAreDevStacks(t *testing.T) {
	want := pgSettings(t)
	cmd := readCompose(t).Services["postgres"].Command
	if len(cmd) == 0 || cmd[0] != "postgres" {
		t.Fatalf("docker-compose.yml's postgres command %q does not start with postgres", cmd)
	}
	got := map[string]string{}
	for i := 1; i < len(cmd); i++ {
		if cmd[i] != "-c" || i+1 == len(cmd) {
			t.Fatalf("docker-compose.yml's postgres command: %q is not -c NAME=VALUE", cmd[i])
		}
		i++
		name, value, ok := strings.Cut(cmd[i], "=")
		if !ok {
			t.Fatalf("docker-compose.yml's postgres command: -c %q is not NAME=VALUE", cmd[i])
		}
		got[name] = value
	}
	for name, w := range want {
		switch g, ok := got[name]; {
		case !ok:
			t.Errorf("docker-compose.yml's postgres lacks -c %s=%s (dev/stack.d/postgres.conf)", name, w)
		case g != w:
			t.Errorf("docker-compose.yml's postgres has -c %s=%s; dev/stack.d/postgres.conf has %s", name, g, w)
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docker-compose.yml's postgres has -c %s=%s, which dev/stack.d/postgres.conf does not set", name, g)
		}
	}
}

// The Maven poms name the versions too (mvn needs them in the pom): they
// must be dev/versions'.
func TestPomsNameDevVersions(t *testing.T) {
	vs := readVersions(t)
	for _, c := range []struct{ pom, property, name string }{
		{"kafka/pom.xml", "kafka.version", "KAFKA_VERSION"},
		{"debezium/pom.xml", "kafka.version", "KAFKA_VERSION"},
		{"debezium/pom.xml", "debezium.version", "DEBEZIUM_VERSION"},
		{"registry/pom.xml", "apicurio.version", "REGISTRY_VERSION"},
	} {
		b, err := os.ReadFile(c.pom)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`<`+regexp.QuoteMeta(c.property)+`>([^<]*)</`).FindAllSubmatch(b, -1)
		if len(m) != 1 {
			t.Errorf("dev/%s: %d <%s> properties, want 1", c.pom, len(m), c.property)
			continue
		}
		if got, want := string(m[0][1]), version(t, vs, c.name); got != want {
			t.Errorf("dev/%s: <%s> is %s; dev/versions' %s is %s", c.pom, c.property, got, c.name, want)
		}
	}
}

// Where Docker Compose is installed, it checks the file as it will read it.
// Not here: the docker client has no compose plugin and there is no daemon
// (config needs neither a daemon nor images).
func TestComposeConfig(t *testing.T) {
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if exec.CommandContext(ctx, "docker", "compose", "version").Run() != nil {
		t.Skip("docker has no compose plugin here")
	}
	cmd := exec.CommandContext(ctx, "docker", "compose", "-f", "docker-compose.yml", "config", "--quiet")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("docker compose config: %v\n%s", err, out)
	}
}
