// The describe command: a service's methods, directives and fields, and request templates.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/reflection"
	"github.com/dabbrpc/dabb/registry"
)

var describeCommand = &command{
	name:    "describe",
	args:    "SERVICE[.METHOD]",
	summary: "describe a service's methods (directives, request and reply fields), or one method",
	help: `
It asks an instance's reflection service (dabb.Reflection), chosen as a call
would choose it, or the instance at -addr. With -template it prints a JSON
request for METHOD with every field at its zero value, to edit and pass to
'dabbctl call'. A server behind credentials takes them from the global -H:

  dabbctl -H 'authorization=Bearer ${TOKEN}' describe inventory.Inventory`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, []string) error {
		template := fs.Bool("template", false, "print a JSON request skeleton for METHOD")
		addr := fs.String("addr", "", "ask the instance at `host:port` instead of one the registry lists")
		timeout := fs.Duration("timeout", 5*time.Second, "bound on the registry's answers and on the call to the reflection service")
		return func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return usagef("want one SERVICE or SERVICE.METHOD, got %d arguments", len(args))
			}
			if *timeout <= 0 {
				return usagef("-timeout %v: want a positive duration", *timeout)
			}
			return a.describe(ctx, args[0], *addr, *template, *timeout)
		}
	},
}

func (a *app) describe(ctx context.Context, name, addr string, template bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	svc, method, err := a.describeTarget(ctx, name, addr, timeout)
	if err != nil {
		return fmt.Errorf("describe %s: %w", name, err)
	}
	var m *reflection.Method
	if method != "" {
		i := slices.IndexFunc(svc.Methods, func(m reflection.Method) bool { return m.Name == method })
		if i < 0 {
			return fmt.Errorf("describe %s: %s has no method %s (it has %s)", name, svc.Name, method, methodNames(svc))
		}
		m = &svc.Methods[i]
	}
	if template {
		if m == nil {
			return usagef("-template needs SERVICE.METHOD")
		}
		if m.Request.Skeleton == "" {
			return fmt.Errorf("describe %s: the server records no request type for %s.%s", name, svc.Name, m.Name)
		}
		return a.printJSONValue([]byte(m.Request.Skeleton))
	}
	if a.json {
		if m != nil {
			return writeJSON(a.stdout, m)
		}
		return writeJSON(a.stdout, svc)
	}
	files := parseFiles(svc.Files)
	fmt.Fprintln(a.stdout, svc.Name)
	for _, each := range svc.Methods {
		if m == nil || each.Name == m.Name {
			printMethod(a.stdout, each, files)
		}
	}
	return nil
}

// describeTarget describes the service name names, or the service of
// which name names a method: inventory.Inventory.Deduct describes
// inventory.Inventory. A name the registry lists (or, with -addr, the
// server has) is a service; otherwise its last dot-separated part is a
// method.
func (a *app) describeTarget(ctx context.Context, name, addr string, timeout time.Duration) (*reflection.Service, string, error) {
	if err := registry.ValidateService(name); err != nil {
		return nil, "", usagef("%v", err)
	}
	service, method := name, ""
	dot := strings.LastIndexByte(name, '.')
	var c *proxy.Client
	var done func()
	var err error
	if addr != "" {
		c, done, err = a.targetClient(ctx, addr, proxy.WithTimeout(timeout))
		if err != nil {
			return nil, "", err
		}
		defer done()
		svc, err := c.Describe(ctx, name)
		if dot <= 0 || !errors.Is(err, proxy.ErrNotFound) || errors.Is(err, proxy.ErrNoReflection) {
			return svc, "", err
		}
		service, method = name[:dot], name[dot+1:]
	} else {
		r, err := a.openRegistry(ctx)
		if err != nil {
			return nil, "", err
		}
		if dot > 0 {
			set, err := instancesOf(ctx, r, name)
			if err != nil {
				r.Close()
				return nil, "", err
			}
			if len(set) == 0 {
				service, method = name[:dot], name[dot+1:]
			}
		}
		c, done, err = a.newClient(r, true, proxy.WithTimeout(timeout))
		if err != nil {
			return nil, "", err
		}
		defer done()
	}
	svc, err := c.Describe(ctx, service)
	return svc, method, err
}

func methodNames(svc *reflection.Service) string {
	names := make([]string, len(svc.Methods))
	for i, m := range svc.Methods {
		names[i] = m.Name
	}
	return strings.Join(names, ", ")
}

// printJSONValue prints a JSON value, indented in table output and on one
// line in JSON output.
func (a *app) printJSONValue(v []byte) error {
	var out bytes.Buffer
	var err error
	if a.json {
		err = json.Compact(&out, v)
	} else {
		err = json.Indent(&out, v, "", "  ")
	}
	if err != nil {
		return fmt.Errorf("the reply is not valid JSON: %w", err)
	}
	out.WriteByte('\n')
	_, err = a.stdout.Write(out.Bytes())
	return err
}

// printMethod prints one method: its directives, and its request's and
// reply's types and fields.
func printMethod(w io.Writer, m reflection.Method, files *protoregistry.Files) {
	line := "  " + m.Name
	if m.Idempotent {
		line += "  idempotent"
	}
	if m.Timeout != "" {
		line += "  timeout " + m.Timeout
	}
	fmt.Fprintln(w, line)
	for _, part := range []struct {
		label string
		t     reflection.Type
	}{{"request", m.Request}, {"reply", m.Response}} {
		fmt.Fprintf(w, "    %-9s%s\n", part.label+":", typeName(part.t))
		fs := fieldsOf(part.t, files)
		tw := newTable(w)
		for _, f := range fs {
			fmt.Fprintf(tw, "      %s\t%s\n", f.name, f.typ)
		}
		tw.Flush()
	}
}

// typeName names a type: its protobuf name and Go type, or its Go type.
func typeName(t reflection.Type) string {
	switch {
	case t.Proto != "":
		return t.Proto + " (" + t.GoType + ")"
	case t.GoType != "":
		return t.GoType + " (JSON)"
	}
	return "(not recorded by the server)"
}

// field is one field of a message: its JSON name and its type.
type field struct{ name, typ string }

// fieldsOf lists t's fields: from the protobuf descriptors for a protobuf
// message, else from its JSON skeleton's keys.
func fieldsOf(t reflection.Type, files *protoregistry.Files) []field {
	if t.Proto != "" && files != nil {
		if d, err := files.FindDescriptorByName(protoreflect.FullName(t.Proto)); err == nil {
			if md, ok := d.(protoreflect.MessageDescriptor); ok {
				var out []field
				for i := 0; i < md.Fields().Len(); i++ {
					fd := md.Fields().Get(i)
					out = append(out, field{fd.JSONName(), protoType(fd)})
				}
				return out
			}
		}
	}
	return skeletonFields(t.Skeleton)
}

// protoType names a protobuf field's type as a .proto file would.
func protoType(fd protoreflect.FieldDescriptor) string {
	if fd.IsMap() {
		return "map<" + protoType(fd.MapKey()) + ", " + protoType(fd.MapValue()) + ">"
	}
	var name string
	switch {
	case fd.Message() != nil:
		name = string(fd.Message().FullName())
	case fd.Enum() != nil:
		name = string(fd.Enum().FullName())
	default:
		name = fd.Kind().String()
	}
	if fd.IsList() {
		return "repeated " + name
	}
	return name
}

// skeletonFields lists the keys of a JSON object skeleton in their order,
// with the JSON type of their zero values.
func skeletonFields(skeleton string) []field {
	dec := json.NewDecoder(strings.NewReader(skeleton))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var out []field
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return out
		}
		out = append(out, field{key, jsonKind(v)})
	}
	return out
}

func jsonKind(v json.RawMessage) string {
	s := strings.TrimSpace(string(v))
	switch {
	case s == "":
		return "?"
	case s[0] == '"':
		return "string"
	case s[0] == '{':
		return "object"
	case s[0] == '[':
		return "array"
	case s == "true" || s == "false":
		return "bool"
	case s == "null":
		return "null"
	}
	return "number"
}

// parseFiles returns the files of a serialized FileDescriptorSet, or nil
// when there are none or they do not parse (fields then come from the
// skeletons).
func parseFiles(b []byte) *protoregistry.Files {
	if len(b) == 0 {
		return nil
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return nil
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil
	}
	return files
}
