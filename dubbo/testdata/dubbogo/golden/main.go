// Command golden writes Dubbo 2 frames with dubbo-go's own encoder
// (protocol/dubbo/impl's ProtocolCodec) into dubbo/testdata/golden, and
// decodes frames that dabb wrote with dubbo-go's decoder.
//
//	cd dubbo/testdata/dubbogo && GOWORK=off go run ./golden write ../golden
//	cd dubbo/testdata/dubbogo && GOWORK=off go run ./golden decode FILE...
//
// decode prints one line a frame, the fields dubbo-go read, with maps in
// key order, so a test can compare them.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"dubbo.apache.org/dubbo-go/v3/protocol/dubbo/impl"
	hessian "github.com/apache/dubbo-go-hessian2"
	"github.com/apache/dubbo-go-hessian2/java_exception"
)

// DeductRequest is com.example.inventory.DeductRequest.
type DeductRequest struct {
	Sku       string
	Count     int32
	RequestId string
}

// JavaClassName names the Java class.
func (DeductRequest) JavaClassName() string { return "com.example.inventory.DeductRequest" }

// DeductReply is com.example.inventory.DeductReply.
type DeductReply struct {
	Remaining int64
	Duplicate bool
}

// JavaClassName names the Java class.
func (DeductReply) JavaClassName() string { return "com.example.inventory.DeductReply" }

const iface = "com.example.inventory.InventoryService"

func main() {
	hessian.RegisterPOJO(&DeductRequest{})
	hessian.RegisterPOJO(&DeductReply{})
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: golden write DIR | golden decode FILE...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "write":
		err = write(os.Args[2])
	case "decode":
		for _, f := range os.Args[2:] {
			if err = decode(f); err != nil {
				break
			}
		}
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "golden:", err)
		os.Exit(1)
	}
}

func request(id int64, method, version string, args []any) ([]byte, error) {
	p := impl.DubboPackage{
		Header: impl.DubboHeader{SerialID: 2, Type: impl.PackageRequest_TwoWay, ID: id},
		Service: impl.Service{
			Path: iface, Interface: iface, Version: version, Method: method,
			Timeout: 3 * time.Second,
		},
		Body: impl.NewRequestPayload(args, map[string]any{"trace": "t-1"}),
	}
	codec := impl.NewDubboCodec(nil)
	return codec.Encode(p)
}

func response(id int64, status byte, value any, exc error, attachments map[string]any) ([]byte, error) {
	p := impl.DubboPackage{
		Header: impl.DubboHeader{SerialID: 2, Type: impl.PackageResponse, ID: id, ResponseStatus: status},
		Body:   impl.NewResponsePayload(value, exc, attachments),
	}
	codec := impl.NewDubboCodec(nil)
	return codec.Encode(p)
}

func write(dir string) error {
	withVersion := func() map[string]any { return map[string]any{"dubbo": "2.0.2", "k": "v"} }
	frames := []struct {
		name string
		make func() ([]byte, error)
	}{
		{"request_deduct", func() ([]byte, error) {
			return request(1, "deduct", "", []any{int64(10086), int32(3)})
		}},
		{"request_deduct_once", func() ([]byte, error) {
			return request(2, "deductOnce", "1.0.0", []any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-1"}})
		}},
		{"request_invoke", func() ([]byte, error) {
			return request(3, "$invoke", "", []any{"stock", []string{"long"}, []any{int64(10086)}})
		}},
		{"response_value", func() ([]byte, error) {
			return response(1, 20, true, nil, withVersion())
		}},
		{"response_value_plain", func() ([]byte, error) {
			return response(4, 20, int64(999997), nil, map[string]any{})
		}},
		{"response_pojo", func() ([]byte, error) {
			return response(2, 20, &DeductReply{Remaining: 999998, Duplicate: true}, nil, withVersion())
		}},
		{"response_null", func() ([]byte, error) {
			return response(5, 20, nil, nil, withVersion())
		}},
		{"response_exception", func() ([]byte, error) {
			return response(6, 20, nil, java_exception.NewIllegalArgumentException("unknown sku 42"), withVersion())
		}},
		{"response_error_status", func() ([]byte, error) {
			return response(7, 70, nil, errors.New("Not found exported service: com.example.Missing:20880"), nil)
		}},
	}
	for _, f := range frames {
		b, err := f.make()
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name+".bin"), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func decode(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	codec := impl.NewDubboCodec(bufio.NewReaderSize(bytes.NewReader(b), len(b)+16))
	var h impl.DubboHeader
	if err := codec.ReadHeader(&h); err != nil {
		return fmt.Errorf("%s: header: %w", file, err)
	}
	body := b[impl.HEADER_LENGTH:]
	name := filepath.Base(file)
	if h.Type&impl.PackageRequest != 0 {
		p := impl.DubboPackage{Header: h}
		if err := codec.Decode(&p); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		req := p.GetBody().(map[string]any)
		svc := p.GetService()
		fmt.Printf("%s: request path=%s version=%s method=%s types=%v args=%s attachments=%v\n",
			name, svc.Path, svc.Version, svc.Method, req["argsTypes"], show(req["args"]), req["attachments"])
		return nil
	}
	if h.ResponseStatus != impl.Response_OK {
		msg, err := hessian.NewDecoder(body).Decode()
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		fmt.Printf("%s: response status=%d message=%v\n", name, h.ResponseStatus, msg)
		return nil
	}
	var out any
	p := impl.DubboPackage{Header: h, Body: &impl.ResponsePayload{RspObj: &out}}
	if err := (impl.HessianSerializer{}).Unmarshal(body, &p); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	rsp := p.Body.(*impl.ResponsePayload)
	if rsp.Exception != nil {
		if t, ok := rsp.Exception.(java_exception.Throwabler); ok {
			fmt.Printf("%s: response exception=%s message=%s attachments=%v\n", name, t.JavaClassName(), message(t), rsp.Attachments)
			return nil
		}
		fmt.Printf("%s: response exception=%v attachments=%v\n", name, rsp.Exception, rsp.Attachments)
		return nil
	}
	fmt.Printf("%s: response value=%s attachments=%v\n", name, show(out), rsp.Attachments)
	return nil
}

// message is a Java exception's detailMessage.
func message(t java_exception.Throwabler) string {
	if u, ok := t.(*hessian.UnknownException); ok {
		return u.DetailMessage
	}
	return t.Error()
}

// show prints a value with its Go type, a POJO as its fields.
func show(v any) string {
	switch v := v.(type) {
	case []any:
		s := "["
		for i, e := range v {
			if i > 0 {
				s += " "
			}
			s += show(e)
		}
		return s + "]"
	case nil:
		return "nil"
	default:
		return fmt.Sprintf("%T(%+v)", v, v)
	}
}
