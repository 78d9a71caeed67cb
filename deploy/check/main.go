// Checks deploy/'s Kubernetes manifests without a cluster: each YAML
// document is decoded strictly, as the API server's strict field validation
// does (an unknown, duplicate or wrongly cased field is an error), into the
// k8s.io/api type its apiVersion and kind name, then held to what
// the agent needs of a node (deploy/agent/daemonset.yaml's comment says
// why). Schema validators would need schemas from outside; the API's own
// Go types are the schema.
//
//	manifest-check FILE.yaml...
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: manifest-check FILE.yaml...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		for _, problem := range checkFile(path) {
			fmt.Fprintf(os.Stderr, "%s: %s\n", path, problem)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func checkFile(path string) []string {
	text, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	for i, doc := range bytes.Split(text, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		for _, p := range checkDocument(doc) {
			problems = append(problems, fmt.Sprintf("document %d: %s", i+1, p))
		}
	}
	return problems
}

func stripComments(doc []byte) []byte {
	var kept [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			kept = append(kept, line)
		}
	}
	return bytes.Join(kept, []byte("\n"))
}

func checkDocument(doc []byte) []string {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return []string{err.Error()}
	}
	var problems []string
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 DaemonSet":
		var ds appsv1.DaemonSet
		if problems = decodeStrict(doc, &ds); problems == nil {
			problems = checkAgent(&ds)
		}
	case "v1 Service":
		problems = decodeStrict(doc, &corev1.Service{})
	case "v1 Namespace":
		problems = decodeStrict(doc, &corev1.Namespace{})
	default:
		problems = []string{fmt.Sprintf("no check for apiVersion %q kind %q", head.APIVersion, head.Kind)}
	}
	return problems
}

// decodeStrict decodes a YAML document into obj with the API server's
// strict rules: case-sensitive, no unknown and no duplicate fields.
func decodeStrict(doc []byte, obj interface{}) []string {
	data, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return []string{err.Error()}
	}
	strict, err := json.UnmarshalStrict(data, obj)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	for _, e := range strict {
		problems = append(problems, e.Error())
	}
	return problems
}

// checkAgent holds the agent's DaemonSet to what the agent checks when it
// starts (crates/record/src/host_access.rs), and to a deployable shape.
func checkAgent(ds *appsv1.DaemonSet) []string {
	var p []string
	spec := ds.Spec.Template.Spec
	if ds.Spec.Selector == nil || !subset(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		p = append(p, "the selector does not match the pod template's labels")
	}
	if !spec.HostPID {
		p = append(p, "hostPID must be true: the trace names threads by their host ids")
	}
	if len(spec.Containers) != 1 {
		return append(p, fmt.Sprintf("one container expected, found %d", len(spec.Containers)))
	}
	c := spec.Containers[0]
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounted := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath] = hostPaths[m.Name]
	}
	for _, path := range []string{"/sys/kernel/tracing", "/sys/kernel/btf"} {
		if mounted[path] != path {
			p = append(p, fmt.Sprintf("the host's %s must be mounted at %s", path, path))
		}
	}
	sc := c.SecurityContext
	if sc == nil {
		return append(p, "no securityContext: the agent needs CAP_BPF and CAP_PERFMON")
	}
	if sc.Privileged != nil && *sc.Privileged {
		p = append(p, "privileged: the capabilities it needs are enough")
	}
	added := map[corev1.Capability]bool{}
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Add {
			added[c] = true
		}
	}
	for _, need := range []corev1.Capability{"BPF", "PERFMON"} {
		if !added[need] {
			p = append(p, fmt.Sprintf("capability %s is not added", need))
		}
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined {
		p = append(p, "seccompProfile must let bpf() through (Unconfined): the runtimes' defaults refuse it")
	}
	limits := c.Resources.Limits
	if limits.Cpu().IsZero() || limits.Memory().IsZero() {
		p = append(p, "CPU and memory limits must be set")
	}
	ports := map[int32]bool{}
	for _, port := range c.Ports {
		ports[port.HostPort] = true
	}
	if !ports[4317] || !ports[4318] {
		p = append(p, "the node's OTLP ports 4317 and 4318 must be hostPorts")
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--forward", "--listen=0.0.0.0"} {
		if !strings.Contains(args, want) {
			p = append(p, fmt.Sprintf("args lack %s", want))
		}
	}
	return p
}

func subset(small, big map[string]string) bool {
	if len(small) == 0 {
		return false
	}
	for k, v := range small {
		if big[k] != v {
			return false
		}
	}
	return true
}
