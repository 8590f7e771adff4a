// Package shapes lives in a directory named v2.
package shapes

// Shape is a shape.
type Shape struct{ Sides int }
