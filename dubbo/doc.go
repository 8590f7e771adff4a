// Package dubbo lets dabb services join an Apache Dubbo estate: Dubbo 2
// bodies in hessian2 (serialization id 2), and Dubbo's interface-level
// layout in ZooKeeper under the registry scheme "zookeeper".
//
// Importing it registers the body format and codec of serialization id 2,
// so a dabb Server answers Dubbo consumers; Service describes a Go value
// as a Java interface for Server.RegisterService, and a zookeeper://
// registry publishes it where Java's consumers look:
//
//	desc, err := dubbo.Service("com.example.inventory.InventoryService", store)
//	err = server.RegisterService(desc, store)
//
// It also calls Java and dubbo-go providers through a proxy.Client over a
// zookeeper:// registry: Invoke makes Dubbo's generic call without a
// stub, and NewClient a typed client from the same declaration as
// Service:
//
//	v, err := dubbo.Invoke(ctx, client, "com.example.Greeter", "sayHello", nil, []any{"world"})
//
// It is a module of its own, so a program that does not import it links
// neither hessian2 nor anything else of Dubbo's:
//
//	import _ "github.com/dabbrpc/dabb/dubbo"
package dubbo
