package dabb_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/reflection"
	gproto "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/typepb"
)

// list calls dabb.Reflection/List on an instance of the probe service.
func list(ctx context.Context, c *proxy.Client) (*reflection.ListReply, error) {
	reply := new(reflection.ListReply)
	err := c.Invoke(ctx, reflection.ServiceName, reflection.MethodList, &reflection.ListRequest{}, reply, proxy.Via(probeDesc.Name))
	return reply, err
}

func TestReflectionList(t *testing.T) {
	s, addr := startServer(t, newProbe())
	if err := s.RegisterService(&kindsDesc, struct{}{}); err != nil {
		t.Fatal(err)
	}
	c := newClientWith(t, []proxy.Option{proxy.WithCodec("json")}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	reply, err := list(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{health.ServiceName, reflection.ServiceName, kindsDesc.Name, probeDesc.Name}
	slices.Sort(want)
	if !slices.Equal(reply.Services, want) {
		t.Errorf("List = %v, want %v", reply.Services, want)
	}
	// The reflection service describes itself.
	svc := new(reflection.Service)
	err = c.Invoke(ctx, reflection.ServiceName, reflection.MethodDescribe, &reflection.DescribeRequest{Service: reflection.ServiceName}, svc,
		proxy.Via(probeDesc.Name))
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Methods) != 2 || svc.Methods[1].Name != reflection.MethodDescribe ||
		svc.Methods[1].Request.GoType != "*reflection.DescribeRequest" || svc.Methods[1].Request.Skeleton != `{"service":""}` {
		t.Errorf("Describe(dabb.Reflection) = %+v", svc)
	}
}

func TestWithoutReflection(t *testing.T) {
	_, addr := startServer(t, newProbe(), dabb.WithoutReflection())
	c := newClientWith(t, []proxy.Option{proxy.WithCodec("json")}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := list(ctx, c)
	pe := statusOf(t, err)
	if pe.Status != protocol.StatusServiceNotFound || pe.Code != protocol.CodeUnimplemented || !pe.Remote {
		t.Errorf("List without reflection = %v, want the server's own 60", err)
	}
}

// TestReflectionNameTaken: an application cannot register a service under
// the reflection service's name, unless reflection is off.
func TestReflectionNameTaken(t *testing.T) {
	desc := probeDesc
	desc.Name = reflection.ServiceName
	if err := dabb.NewServer(dabb.WithLogger(quiet)).RegisterService(&desc, newProbe()); err == nil || !strings.Contains(err.Error(), "taken by a service every dabb server has built in") {
		t.Errorf("RegisterService(%s) = %v, want the name taken by a built-in service", reflection.ServiceName, err)
	}
	if err := dabb.NewServer(dabb.WithLogger(quiet), dabb.WithoutReflection()).RegisterService(&desc, newProbe()); err != nil {
		t.Errorf("RegisterService(%s) with reflection off: %v", reflection.ServiceName, err)
	}
}

// TestReflectionThroughInterceptors: the reflection service runs through
// the server's interceptors: a token check applies to it too.
func TestReflectionThroughInterceptors(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	record := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		mu.Lock()
		seen = append(seen, info.Service+"/"+info.Method)
		mu.Unlock()
		return next(ctx)
	}
	_, addr := startServer(t, newProbe(), dabb.WithInterceptor(record, dabb.RequireToken("s3cret")))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	anon := newClientWith(t, []proxy.Option{proxy.WithCodec("json")}, addr)
	if _, err := list(ctx, anon); !errors.Is(err, proxy.ErrUnauthenticated) {
		t.Errorf("List without the token = %v, want ErrUnauthenticated", err)
	}
	if _, err := anon.Describe(ctx, probeDesc.Name); !errors.Is(err, proxy.ErrUnauthenticated) {
		t.Errorf("Describe without the token = %v, want ErrUnauthenticated", err)
	}
	token := proxy.BearerToken(func(context.Context) (string, error) { return "s3cret", nil })
	known := newClientWith(t, []proxy.Option{proxy.WithCodec("json"), proxy.WithCredentials(plaintextOK{token})}, addr)
	if _, err := list(ctx, known); err != nil {
		t.Errorf("List with the token: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"dabb.Reflection/List", "dabb.Reflection/Describe", "dabb.Reflection/List"}
	if !slices.Equal(seen, want) {
		t.Errorf("interceptor saw %v, want %v", seen, want)
	}
}

// TestReflectionNotPublished: the reflection service is served but never
// published: etcd lists the application's service only.
func TestReflectionNotPublished(t *testing.T) {
	url := "etcd://" + etcdtest.Start(t).Endpoint() + "/services?ttl=2s"
	_, addr := startServer(t, newProbe(), dabb.WithRegistry(openRegistry(t, url)))
	reg := openRegistry(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Serve publishes before it accepts: once a call is answered, all
	// that it publishes is in etcd.
	if _, err := call(ctx, newClient(t, addr), "echo"); err != nil {
		t.Fatal(err)
	}
	for svc, want := range map[string]int{probeDesc.Name: 1, reflection.ServiceName: 0} {
		w, err := reg.Watch(ctx, svc)
		if err != nil {
			t.Fatal(err)
		}
		ins, err := w.Next(ctx)
		w.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if len(ins) != want || want == 1 && ins[0].Addr != addr {
			t.Errorf("etcd lists %v for %s, want %d instance(s)", ins, svc, want)
		}
	}
}

// node is a type that contains itself.
type node struct {
	Name     string  `json:"name"`
	Next     *node   `json:"next"`
	Children []node  `json:"children"`
	Peers    []*node `json:"peers"`
}

type embedded struct {
	Inner string `json:"inner"`
}

type wide struct {
	embedded
	Labels  map[string]*node `json:"labels"`
	Any     any              `json:"any"`
	Data    []byte           `json:"data"`
	Count   *int             `json:"count"`
	Skipped chan int         `json:"-"`
	Deep    l1               `json:"deep"`
}

type l1 struct{ L2 l2 }
type l2 struct{ L3 l3 }
type l3 struct{ L4 l4 }
type l4 struct{ L5 l5 }
type l5 struct{ L6 l6 }
type l6 struct{ X int }

type withChan struct {
	C chan int `json:"c"`
}

// panicky panics when encoding/json writes its zero value.
type panicky struct{ p *int }

func (v panicky) MarshalJSON() ([]byte, error) { return []byte(string(rune(*v.p))), nil }

// kindsDesc is a service whose messages have every kind of field a
// skeleton must survive. Its handler is never called.
var kindsDesc = dabb.ServiceDesc{
	Name: "test.Kinds",
	Methods: []dabb.MethodDesc{
		{Name: "Cycle", Request: (*node)(nil), Response: node{}, Handler: noHandler},
		{Name: "Wide", Request: (*wide)(nil), Response: (*withChan)(nil), Handler: noHandler},
		{Name: "Panicky", Request: (*panicky)(nil), Response: (*string)(nil), Handler: noHandler},
		{Name: "Proto", Request: (*typepb.Type)(nil), Response: (*descriptorpb.FileDescriptorSet)(nil), Handler: noHandler},
		{Name: "Value", Request: (*structpb.Value)(nil), Response: (*structpb.Struct)(nil), Handler: noHandler},
	},
}

func noHandler(any, context.Context, func(any) error) (any, error) {
	return nil, errors.New("not called")
}

func TestReflectionSkeletons(t *testing.T) {
	s, addr := startServer(t, newProbe())
	if err := s.RegisterService(&kindsDesc, struct{}{}); err != nil {
		t.Fatal(err)
	}
	c := newClientWith(t, []proxy.Option{proxy.WithCodec("json")}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Via the probe: the registry lists its instance.
	svc := new(reflection.Service)
	err := c.Invoke(ctx, reflection.ServiceName, reflection.MethodDescribe, &reflection.DescribeRequest{Service: kindsDesc.Name}, svc,
		proxy.Via(probeDesc.Name))
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]reflection.Type{}
	for _, m := range svc.Methods {
		types[m.Name+".req"], types[m.Name+".resp"] = m.Request, m.Response
	}
	for key, want := range map[string]string{
		"Cycle.req":    `{"name":"","next":null,"children":[],"peers":[]}`,
		"Cycle.resp":   `{"name":"","next":null,"children":[],"peers":[]}`,
		"Wide.req":     `{"inner":"","labels":{},"any":null,"data":null,"count":0,"deep":{"L2":{"L3":{"L4":{"L5":{"L6":{"X":0}}}}}}}`,
		"Wide.resp":    ``, // a channel: encoding/json cannot write it
		"Panicky.req":  ``,
		"Panicky.resp": `""`,
		"Proto.req": `{"name":"","fields":[{"kind":"TYPE_UNKNOWN","cardinality":"CARDINALITY_UNKNOWN","number":0,"name":"",` +
			`"typeUrl":"","oneofIndex":0,"packed":false,"options":[],"jsonName":"","defaultValue":""}],"oneofs":[],"options":[{"name":"","value":null}],` +
			`"sourceContext":{"fileName":""},"syntax":"SYNTAX_PROTO2","edition":""}`,
		"Value.req":  ``,
		"Value.resp": `{}`,
	} {
		if got := types[key].Skeleton; got != want {
			t.Errorf("%s skeleton\n got %s\nwant %s", key, got, want)
		}
	}
	if g := types["Cycle.resp"].GoType; g != "dabb_test.node" {
		t.Errorf("Cycle's response Go type = %q", g)
	}
	if p := types["Proto.req"].Proto; p != "google.protobuf.Type" {
		t.Errorf("Proto's request = %q, want google.protobuf.Type", p)
	}
	var set descriptorpb.FileDescriptorSet
	if err := gproto.Unmarshal(svc.Files, &set); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range set.File {
		names = append(names, f.GetName())
	}
	// Each file after those it imports; each once.
	want := []string{"google/protobuf/any.proto", "google/protobuf/source_context.proto", "google/protobuf/type.proto",
		"google/protobuf/descriptor.proto", "google/protobuf/struct.proto"}
	if !slices.Equal(names, want) {
		t.Errorf("Files hold %v, want %v", names, want)
	}
}
