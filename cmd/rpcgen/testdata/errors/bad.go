// Package bad holds one interface per way of getting rpcgen's input wrong.
// The test finds the line each error must point at within the block of the
// declaration (the lines between blank lines), so keep blank lines between cases.
package bad

import (
	"context"
	"io"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/shared"
)

type Req struct{ A int }
type Resp struct{ B int }
type unexportedReq struct{}
type Gen[T any] struct{ V T }
type Str string
type Iface interface{ M() }

type TooFewParams interface {
	M(req *Req) (*Resp, error)
}

type TooManyParams interface {
	M(ctx context.Context, req *Req, n int) (*Resp, error)
}

type CtxNotFirst interface {
	M(s string, req *Req) (*Resp, error)
}

type Variadic interface {
	M(ctx context.Context, reqs ...*Req) (*Resp, error)
}

type ReqNotPointer interface {
	M(ctx context.Context, req Req) (*Resp, error)
}

type ReqBasic interface {
	M(ctx context.Context, req *string) (*Resp, error)
}

type ReqUnnamed interface {
	M(ctx context.Context, req *struct{ A int }) (*Resp, error)
}

type ReqNotStruct interface {
	M(ctx context.Context, req *Str) (*Resp, error)
}

type ReqInterface interface {
	M(ctx context.Context, req *Iface) (*Resp, error)
}

type ReqGeneric interface {
	M(ctx context.Context, req *Gen[int]) (*Resp, error)
}

type OneResult interface {
	M(ctx context.Context, req *Req) error
}

type NoError interface {
	M(ctx context.Context, req *Req) (*Resp, bool)
}

type RespNotPointer interface {
	M(ctx context.Context, req *Req) (Resp, error)
}

type RespSlice interface {
	M(ctx context.Context, req *Req) ([]*Resp, error)
}

type Unexported interface {
	m(ctx context.Context, req *Req) (*Resp, error)
}

type UnknownDirective interface {
	//dabb:idempotnet
	M(ctx context.Context, req *Req) (*Resp, error)
}

type BadDuration interface {
	//dabb:timeout fast
	M(ctx context.Context, req *Req) (*Resp, error)
}

type NegativeDuration interface {
	//dabb:timeout -2s
	M(ctx context.Context, req *Req) (*Resp, error)
}

type MissingDuration interface {
	//dabb:timeout
	M(ctx context.Context, req *Req) (*Resp, error)
}

type TwoDurations interface {
	//dabb:timeout 1s 2s
	M(ctx context.Context, req *Req) (*Resp, error)
}

type IdempotentArg interface {
	//dabb:idempotent yes
	M(ctx context.Context, req *Req) (*Resp, error)
}

type ServiceOnMethod interface {
	//dabb:service x.Y
	M(ctx context.Context, req *Req) (*Resp, error)
}

// IdempotentOnInterface has a method directive in its own doc.
//
//dabb:idempotent
type IdempotentOnInterface interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

// ServiceNoName has a service directive without a name.
//
//dabb:service
type ServiceNoName interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

// UnknownOnInterface has a typo in its doc.
//
//dabb:servise x.Y
type UnknownOnInterface interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

type Detached interface {
	//dabb:idempotent

	M(ctx context.Context, req *Req) (*Resp, error)
}

type Trailing interface {
	M(ctx context.Context, req *Req) (*Resp, error) //dabb:idempotent
}

type NotIface struct{}

type Empty interface{}

type OnlyEmbedsEmpty interface {
	Empty
}

type Constraint interface{ ~int }

type Generic[T any] interface {
	M(ctx context.Context, req *T) (*Resp, error)
}

type Alias = TooFewParams

type unexportedIface interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

type EmbedsReader interface {
	io.Reader
}

type EmbedsError interface {
	error
}

type ReqUnexportedOK interface {
	M(ctx context.Context, req *unexportedReq) (*Resp, error)
}

type Collide interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

func NewCollideClient() {}

type Conflicting interface {
	Base
	//dabb:idempotent
	M(ctx context.Context, req *Req) (*Resp, error)
}

type Base interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

var NotAType = 1

type EmbedsUnion interface {
	~int | ~string
	M(ctx context.Context, req *Req) (*Resp, error)
}

type EmbedsStruct interface {
	Req
	M(ctx context.Context, req *Req) (*Resp, error)
}

type EmbedsComparable interface {
	comparable
	M(ctx context.Context, req *Req) (*Resp, error)
}

// GroupDoc and GroupOther share a doc comment, which documents neither.
//
//dabb:service x.Y
type (
	GroupDoc interface {
		M(ctx context.Context, req *Req) (*Resp, error)
	}
	GroupOther interface {
		M(ctx context.Context, req *Req) (*Resp, error)
	}
)

type SpacedDirective interface {
	// M reads.
	// dabb:idempotent
	M(ctx context.Context, req *Req) (*Resp, error)
}

// SpacedOnInterface has a space in its directive.
//
//	dabb:service x.Y
type SpacedOnInterface interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

// ServiceSlash has a name the registry refuses.
//
//dabb:service shop/Orders
type ServiceSlash interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

// ServiceDots has a name the registry reserves.
//
//dabb:service ..
type ServiceDots interface {
	M(ctx context.Context, req *Req) (*Resp, error)
}

type DetachedInLiteral interface {
	interface {
		//dabb:idempotent

		M(ctx context.Context, req *Req) (*Resp, error)
	}
}

type EmbedsInternal interface {
	shared.Noter
}
