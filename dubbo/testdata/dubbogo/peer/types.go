package main

import hessian "github.com/apache/dubbo-go-hessian2"

// Java class names of the POJOs.
const (
	deductRequestClass = "com.example.inventory.DeductRequest"
	deductReplyClass   = "com.example.inventory.DeductReply"
	helloRequestClass  = "com.example.HelloRequest"
	helloReplyClass    = "com.example.HelloReply"
)

// Java interface names.
const (
	inventoryInterface = "com.example.inventory.InventoryService"
	greeterInterface   = "com.example.Greeter"
)

// DeductRequest is com.example.inventory.DeductRequest
// {String sku; int count; String requestId}.
type DeductRequest struct {
	Sku       string `hessian:"sku" json:"sku"`
	Count     int32  `hessian:"count" json:"count"`
	RequestId string `hessian:"requestId" json:"requestId"`
}

func (DeductRequest) JavaClassName() string { return deductRequestClass }

// DeductReply is com.example.inventory.DeductReply
// {long remaining; boolean duplicate}.
type DeductReply struct {
	Remaining int64 `hessian:"remaining" json:"remaining"`
	Duplicate bool  `hessian:"duplicate" json:"duplicate"`
}

func (DeductReply) JavaClassName() string { return deductReplyClass }

// HelloRequest is com.example.HelloRequest {String name}.
type HelloRequest struct {
	Name string `hessian:"name" json:"name"`
}

func (HelloRequest) JavaClassName() string { return helloRequestClass }

// HelloReply is com.example.HelloReply {String message; int length}.
type HelloReply struct {
	Message string `hessian:"message" json:"message"`
	Length  int32  `hessian:"length" json:"length"`
}

func (HelloReply) JavaClassName() string { return helloReplyClass }

func init() {
	hessian.RegisterPOJO(&DeductRequest{})
	hessian.RegisterPOJO(&DeductReply{})
	hessian.RegisterPOJO(&HelloRequest{})
	hessian.RegisterPOJO(&HelloReply{})
}
