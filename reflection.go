// The built-in reflection service: dabb.Reflection's List and Describe, and the descriptions they give.

package dabb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"

	_ "github.com/dabbrpc/dabb/codec/json" // the built-in services' codec
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/reflection"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// reflectionServer serves dabb.Reflection from its server's service table.
type reflectionServer struct{ s *Server }

// reflectionDesc describes dabb.Reflection. It has no HandlerType: the
// implementation is always a *reflectionServer.
var reflectionDesc = ServiceDesc{
	Name: reflection.ServiceName,
	Methods: []MethodDesc{
		{Name: reflection.MethodList, Idempotent: true,
			Request: (*reflection.ListRequest)(nil), Response: (*reflection.ListReply)(nil),
			Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
				req := new(reflection.ListRequest)
				if err := dec(req); err != nil {
					return nil, err
				}
				return srv.(*reflectionServer).list(), nil
			}},
		{Name: reflection.MethodDescribe, Idempotent: true,
			Request: (*reflection.DescribeRequest)(nil), Response: (*reflection.Service)(nil),
			Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
				req := new(reflection.DescribeRequest)
				if err := dec(req); err != nil {
					return nil, err
				}
				return srv.(*reflectionServer).describe(req.Service)
			}},
	},
}

// list names every service in the table, built-in ones included, sorted.
func (r *reflectionServer) list() *reflection.ListReply {
	table := *r.s.services.Load()
	out := &reflection.ListReply{Services: make([]string, 0, len(table))}
	for name := range table {
		out.Services = append(out.Services, name)
	}
	sort.Strings(out.Services)
	return out
}

// describe describes the service named name. An unknown name is a 60 with
// code not_found: the reflection service exists, the service it was asked
// about does not.
func (r *reflectionServer) describe(name string) (*reflection.Service, error) {
	svc := (*r.s.services.Load())[name]
	if svc == nil {
		return nil, protocol.NewError(protocol.StatusServiceNotFound, protocol.CodeNotFound,
			"reflection: service "+name+" not found on this server")
	}
	return describeService(svc.desc), nil
}

// describeService describes desc: its methods in their declared order,
// and the protobuf files their messages need.
func describeService(desc *ServiceDesc) *reflection.Service {
	out := &reflection.Service{Name: desc.Name, Methods: make([]reflection.Method, 0, len(desc.Methods))}
	files := &fileSet{seen: map[string]bool{}}
	for _, m := range desc.Methods {
		rm := reflection.Method{
			Name:       m.Name,
			Idempotent: m.Idempotent,
			Request:    describeType(m.Request, files),
			Response:   describeType(m.Response, files),
		}
		if m.Timeout > 0 {
			rm.Timeout = m.Timeout.String()
		}
		out.Methods = append(out.Methods, rm)
	}
	if len(files.set.File) > 0 {
		if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(&files.set); err == nil {
			out.Files = b
		}
	}
	return out
}

// describeType describes the type of v, a typed nil pointer from a
// MethodDesc. A nil v describes an unknown type: every field is empty.
// A protobuf message adds its file, and the files it imports, to files.
func describeType(v any, files *fileSet) reflection.Type {
	if v == nil {
		return reflection.Type{}
	}
	t := reflect.TypeOf(v)
	out := reflection.Type{GoType: t.String()}
	if m, ok := v.(proto.Message); ok {
		// ProtoReflect on a typed nil pointer answers the descriptor;
		// New makes a message to fill.
		md := m.ProtoReflect().Descriptor()
		out.Proto = string(md.FullName())
		files.add(md.ParentFile())
		out.Skeleton = protoSkeleton(m.ProtoReflect().Type().New())
		return out
	}
	out.Skeleton = jsonSkeleton(t)
	return out
}

// fileSet gathers protobuf files, each after the files it imports.
type fileSet struct {
	set  descriptorpb.FileDescriptorSet
	seen map[string]bool
}

// add adds fd and, first, its transitive imports, as
// protoregistry.GlobalFiles holds them. A file missing there (a message
// built at run time) is taken as its descriptor gives it; a placeholder
// (an import never loaded) is left out.
func (f *fileSet) add(fd protoreflect.FileDescriptor) {
	if fd == nil || f.seen[fd.Path()] {
		return
	}
	f.seen[fd.Path()] = true
	if found, err := protoregistry.GlobalFiles.FindFileByPath(fd.Path()); err == nil {
		fd = found
	} else if fd.IsPlaceholder() {
		return
	}
	imports := fd.Imports()
	for i := 0; i < imports.Len(); i++ {
		f.add(imports.Get(i).FileDescriptor)
	}
	f.set.File = append(f.set.File, protodesc.ToFileDescriptorProto(fd))
}

// protoSkeleton is m as protojson writes it with every field present. Its
// singular and repeated message fields hold one empty message each (one
// level deep), so their fields show too. A field in a oneof stays unset:
// setting one would hide the others.
func protoSkeleton(m protoreflect.Message) string {
	opts := protojson.MarshalOptions{EmitUnpopulated: true}
	plain, err := opts.Marshal(m.Interface())
	if err != nil {
		return ""
	}

	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Message() == nil || fd.IsMap() || fd.ContainingOneof() != nil {
			continue
		}
		if fd.IsList() {
			m.Mutable(fd).List().AppendMutable()
		} else {
			m.Mutable(fd)
		}
	}
	filled, err := opts.Marshal(m.Interface())
	if err != nil {
		// A well-known type such as google.protobuf.Value has no JSON
		// form when empty: the skeleton then leaves the fields null.
		return compactJSON(plain)
	}
	return compactJSON(filled)
}

// skeletonDepth bounds how deep jsonSkeleton fills nested structs.
const skeletonDepth = 4

// jsonSkeleton is the encoding/json text of a zero t whose nested structs
// and pointers are filled down to skeletonDepth levels, and whose slices
// of structs hold one such element. A type met again inside itself stays
// nil. A type encoding/json cannot write (a channel, a func, a
// MarshalJSON that fails or panics) gives "".
func jsonSkeleton(t reflect.Type) (out string) {
	defer func() {
		if recover() != nil {
			out = ""
		}
	}()
	v := reflect.New(t).Elem()
	fillSkeleton(v, 0, nil)
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return ""
	}
	return string(b)
}

// fillSkeleton fills v, at depth, with path the struct types it is inside.
func fillSkeleton(v reflect.Value, depth int, path []reflect.Type) {
	if depth > skeletonDepth || !v.CanSet() {
		return
	}
	t := v.Type()
	switch t.Kind() {
	case reflect.Pointer:
		if e := t.Elem(); e.Kind() == reflect.Struct && slices.Contains(path, e) {
			return // a cycle: the pointer stays nil
		}
		p := reflect.New(t.Elem())
		fillSkeleton(p.Elem(), depth+1, path)
		v.Set(p)
	case reflect.Struct:
		if slices.Contains(path, t) {
			return
		}
		path = append(path, t)
		for i := 0; i < t.NumField(); i++ {
			if f := t.Field(i); f.IsExported() || f.Anonymous {
				fillSkeleton(v.Field(i), depth+1, path)
			}
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return // []byte is a base64 string
		}
		s := reflect.MakeSlice(t, 0, 1)
		if fillable(t.Elem(), path) {
			s = reflect.Append(s, reflect.New(t.Elem()).Elem())
			fillSkeleton(s.Index(0), depth+1, path)
		}
		v.Set(s)
	case reflect.Map:
		v.Set(reflect.MakeMap(t))
	}
}

// fillable reports whether a value of t is worth an element or a pointee
// in a skeleton: a struct, or a pointer to one, not already on path.
func fillable(t reflect.Type, path []reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct && !slices.Contains(path, t)
}

// installReflection serves dabb.Reflection on s.
func (s *Server) installReflection() {
	if err := s.installBuiltin(&reflectionDesc, &reflectionServer{s}); err != nil {
		panic(fmt.Sprintf("dabb: install %s: %v", reflection.ServiceName, err)) // a bug in reflectionDesc
	}
}

// installBuiltin puts a built-in service in s's table. Built-in services
// are never published to the registry.
func (s *Server) installBuiltin(desc *ServiceDesc, impl any) error {
	svc, err := newService(desc, impl)
	if err != nil {
		return err
	}
	svc.builtin = true
	return s.swapServices(func(m map[string]*service) error {
		if _, dup := m[svc.name]; dup {
			return fmt.Errorf("dabb: built-in service %s: already registered", svc.name)
		}
		m[svc.name] = svc
		return nil
	})
}

// compactJSON is valid JSON b without insignificant space. protojson
// varies its spacing on purpose; a skeleton has one form.
func compactJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return string(b)
	}
	return out.String()
}
