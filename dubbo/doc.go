// Package dubbo lets dabb services join an Apache Dubbo estate: Dubbo 2
// bodies in hessian2 (serialization id 2), and Dubbo's interface-level
// layout in ZooKeeper under the registry scheme "zookeeper".
//
// It is a module of its own, so a program that does not import it links
// neither hessian2 nor anything else of Dubbo's:
//
//	import _ "github.com/dabbrpc/dabb/dubbo"
package dubbo
