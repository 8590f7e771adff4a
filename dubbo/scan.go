// The scan of hessian2 values that checks a body against its limits before
// the hessian2 library decodes it.
//
// The library allocates a list by its declared length and recurses without
// a bound, so a few bytes could ask for gigabytes or a deep stack; the scan
// walks the same grammar without allocating and refuses such a body first.

package dubbo

import "fmt"

// scanner walks hessian2 values in buf from off.
type scanner struct {
	buf      []byte
	off      int
	start    int // where the values after a response's result flag begin
	maxDepth int
	// classes holds the field count of each class definition seen, in
	// order; an object names its class by index into it.
	classes []int
	// names holds the name of each class definition seen, in order.
	names []string
	// first is the class index of the first object passed since it was
	// set to -1: the outermost object of a value.
	first int64
	// allow says whether a class definition's name and fields may be
	// decoded; nil allows every class.
	allow func(name string, fields []string) bool
	// keep makes chars copy what it passes into text, for str.
	keep bool
	text []byte
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformed, s.off, fmt.Sprintf(format, args...))
}

func (s *scanner) remaining() int { return len(s.buf) - s.off }

// byte reads one byte.
func (s *scanner) byte() (byte, error) {
	if s.off >= len(s.buf) {
		return 0, s.errorf("body ends inside a value")
	}
	b := s.buf[s.off]
	s.off++
	return b, nil
}

// skip passes n bytes.
func (s *scanner) skip(n int) error {
	if n < 0 || n > s.remaining() {
		return s.errorf("a value of %d bytes where %d remain", n, s.remaining())
	}
	s.off += n
	return nil
}

// length checks a declared element count against the bytes left: each
// element takes at least one byte.
func (s *scanner) length(n int64, what string) (int, error) {
	if n < 0 || n > int64(s.remaining()) {
		return 0, fmt.Errorf("%w: at byte %d: a %s of declared length %d where %d bytes remain",
			ErrTooLarge, s.off, what, n, s.remaining())
	}
	return int(n), nil
}

// value passes one value.
func (s *scanner) value(depth int) error {
	if depth > s.maxDepth {
		return fmt.Errorf("%w: at byte %d: values nested deeper than %d", ErrTooLarge, s.off, s.maxDepth)
	}
	tag, err := s.byte()
	if err != nil {
		return err
	}
	switch {
	case tag <= 0x1f: // string of 0-31 chars
		return s.chars(int64(tag))
	case tag <= 0x2f: // binary of 0-15 bytes
		return s.skip(int(tag - 0x20))
	case tag <= 0x33: // string of up to 1023 chars
		b, err := s.byte()
		if err != nil {
			return err
		}
		return s.chars(int64(tag-0x30)<<8 | int64(b))
	case tag <= 0x37: // binary of up to 1023 bytes
		b, err := s.byte()
		if err != nil {
			return err
		}
		return s.skip(int(tag-0x34)<<8 | int(b))
	case tag <= 0x3f: // three-byte long
		return s.skip(2)
	case tag >= 0x80 && tag <= 0xbf: // one-byte int
		return nil
	case tag >= 0xc0 && tag <= 0xcf: // two-byte int
		return s.skip(1)
	case tag >= 0xd0 && tag <= 0xd7: // three-byte int
		return s.skip(2)
	case tag >= 0xd8 && tag <= 0xef: // one-byte long
		return nil
	case tag >= 0xf0: // two-byte long
		return s.skip(1)
	case tag >= 0x60 && tag <= 0x6f: // object of class 0-15
		return s.object(int64(tag-0x60), depth)
	case tag >= 0x70 && tag <= 0x77: // typed list of 0-7
		if err := s.typ(); err != nil {
			return err
		}
		return s.elements(int64(tag-0x70), depth)
	case tag >= 0x78 && tag <= 0x7f: // untyped list of 0-7
		return s.elements(int64(tag-0x78), depth)
	}
	switch tag {
	case 'N', 'T', 'F', 0x5b, 0x5c: // null, true, false, 0.0, 1.0
		return nil
	case 0x5d: // double as a byte
		return s.skip(1)
	case 0x5e: // double as a short
		return s.skip(2)
	case 0x5f, 'I', 'Y', 'K': // double as a float, int, long as int, date in minutes
		return s.skip(4)
	case 'D', 'L', 'J': // double, long, date
		return s.skip(8)
	case 'S', 'R': // final and non-final string chunks
		return s.stringChunks(tag)
	case 'B', 'A': // final and non-final binary chunks
		return s.binaryChunks(tag)
	case 'C': // class definition, then the value it precedes
		if err := s.classDef(); err != nil {
			return err
		}
		// The depth grows here too, so a run of definitions is bounded.
		return s.value(depth + 1)
	case 'O': // object of a class given by index
		n, err := s.int()
		if err != nil {
			return err
		}
		return s.object(n, depth)
	case 'Q': // reference to an earlier list, map or object
		_, err := s.int()
		return err
	case 'V': // typed list of declared length
		if err := s.typ(); err != nil {
			return err
		}
		n, err := s.int()
		if err != nil {
			return err
		}
		return s.elements(n, depth)
	case 'X': // untyped list of declared length
		n, err := s.int()
		if err != nil {
			return err
		}
		return s.elements(n, depth)
	case 'U': // typed list up to 'Z'
		if err := s.typ(); err != nil {
			return err
		}
		return s.untilEnd(depth, 1)
	case 'W': // untyped list up to 'Z'
		return s.untilEnd(depth, 1)
	case 'M': // typed map up to 'Z'
		if err := s.typ(); err != nil {
			return err
		}
		return s.untilEnd(depth, 2)
	case 'H': // untyped map up to 'Z'
		return s.untilEnd(depth, 2)
	}
	s.off--
	return s.errorf("tag 0x%02x starts no hessian2 value", tag)
}

// int reads an int value, as an object index, list length or reference.
func (s *scanner) int() (int64, error) {
	tag, err := s.byte()
	if err != nil {
		return 0, err
	}
	switch {
	case tag >= 0x80 && tag <= 0xbf:
		return int64(tag) - 0x90, nil
	case tag >= 0xc0 && tag <= 0xcf:
		b, err := s.byte()
		return (int64(tag)-0xc8)<<8 | int64(b), err
	case tag >= 0xd0 && tag <= 0xd7:
		if err := s.skip(2); err != nil {
			return 0, err
		}
		return (int64(tag)-0xd4)<<16 | int64(s.buf[s.off-2])<<8 | int64(s.buf[s.off-1]), nil
	case tag == 'I':
		if err := s.skip(4); err != nil {
			return 0, err
		}
		b := s.buf[s.off-4:]
		return int64(int32(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))), nil
	}
	s.off--
	return 0, s.errorf("tag 0x%02x where an int was expected", tag)
}

// typ passes a list's or map's type: a string, or an int naming an
// earlier type.
func (s *scanner) typ() error {
	if s.off < len(s.buf) {
		tag := s.buf[s.off]
		if tag <= 0x1f || (tag >= 0x30 && tag <= 0x33) || tag == 'S' || tag == 'R' {
			_, err := s.str()
			return err
		}
	}
	_, err := s.int()
	return err
}

// str reads a string value and returns it; a class or field name.
func (s *scanner) str() (string, error) {
	s.text = s.text[:0]
	s.keep = true
	defer func() { s.keep = false }()
	tag, err := s.byte()
	if err != nil {
		return "", err
	}
	switch {
	case tag <= 0x1f:
		err = s.chars(int64(tag))
	case tag >= 0x30 && tag <= 0x33:
		var b byte
		if b, err = s.byte(); err == nil {
			err = s.chars(int64(tag-0x30)<<8 | int64(b))
		}
	case tag == 'S' || tag == 'R':
		err = s.stringChunks(tag)
	default:
		s.off--
		return "", s.errorf("tag 0x%02x where a string was expected", tag)
	}
	if err != nil {
		return "", err
	}
	return string(s.text), nil
}

// chars passes n UTF-16 code units of hessian2's UTF-8.
func (s *scanner) chars(declared int64) error {
	n, err := s.length(declared, "string")
	if err != nil {
		return err
	}
	start := s.off
	if s.keep {
		defer func() { s.text = append(s.text, s.buf[start:s.off]...) }()
	}
	for i := 0; i < n; i++ {
		if s.off >= len(s.buf) {
			return s.errorf("body ends inside a string")
		}
		b := s.buf[s.off]
		switch {
		case b < 0x80:
			s.off++
		case b&0xe0 == 0xc0:
			err = s.skip(2)
		case b&0xf0 == 0xe0:
			err = s.skip(3)
		case b&0xf8 == 0xf0: // a supplementary character is two code units
			err = s.skip(4)
			i++
		default:
			return s.errorf("byte 0x%02x inside a string is no UTF-8", b)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// stringChunks passes 'R' chunks up to a final 'S' chunk; tag is read.
func (s *scanner) stringChunks(tag byte) error {
	for {
		if err := s.skip(2); err != nil {
			return err
		}
		n := int64(s.buf[s.off-2])<<8 | int64(s.buf[s.off-1])
		if err := s.chars(n); err != nil {
			return err
		}
		if tag == 'S' {
			return nil
		}
		var err error
		if tag, err = s.byte(); err != nil {
			return err
		}
		if tag == 'S' || tag == 'R' {
			continue
		}
		if tag <= 0x1f {
			return s.chars(int64(tag))
		}
		if tag >= 0x30 && tag <= 0x33 {
			b, err := s.byte()
			if err != nil {
				return err
			}
			return s.chars(int64(tag-0x30)<<8 | int64(b))
		}
		s.off--
		return s.errorf("tag 0x%02x inside a chunked string", tag)
	}
}

// binaryChunks passes 'A' chunks up to a final 'B' chunk; tag is read.
func (s *scanner) binaryChunks(tag byte) error {
	for {
		if err := s.skip(2); err != nil {
			return err
		}
		if err := s.skip(int(s.buf[s.off-2])<<8 | int(s.buf[s.off-1])); err != nil {
			return err
		}
		if tag == 'B' {
			return nil
		}
		var err error
		if tag, err = s.byte(); err != nil {
			return err
		}
		switch {
		case tag == 'A' || tag == 'B':
		case tag >= 0x20 && tag <= 0x2f:
			return s.skip(int(tag - 0x20))
		case tag >= 0x34 && tag <= 0x37:
			b, err := s.byte()
			if err != nil {
				return err
			}
			return s.skip(int(tag-0x34)<<8 | int(b))
		default:
			s.off--
			return s.errorf("tag 0x%02x inside a chunked binary", tag)
		}
	}
}

// classDef reads a class definition after its 'C' and checks its name.
func (s *scanner) classDef() error {
	name, err := s.str()
	if err != nil {
		return err
	}
	n, err := s.int()
	if err != nil {
		return err
	}
	count, err := s.length(n, "class definition")
	if err != nil {
		return err
	}
	fields := make([]string, count)
	for i := range fields {
		if fields[i], err = s.str(); err != nil {
			return err
		}
	}
	if s.allow != nil && !s.allow(name, fields) {
		return fmt.Errorf("%w: %s", ErrUnknownClass, name)
	}
	s.classes = append(s.classes, count)
	s.names = append(s.names, name)
	return nil
}

// object passes the fields of an object of class index idx.
func (s *scanner) object(idx int64, depth int) error {
	if idx < 0 || idx >= int64(len(s.classes)) {
		return s.errorf("an object of class %d where %d classes are defined", idx, len(s.classes))
	}
	if s.first < 0 {
		s.first = idx
	}
	return s.elements(int64(s.classes[idx]), depth)
}

// elements passes n values.
func (s *scanner) elements(n int64, depth int) error {
	count, err := s.length(n, "list")
	if err != nil {
		return err
	}
	for range count {
		if err := s.value(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// untilEnd passes values, per entry, up to a 'Z'.
func (s *scanner) untilEnd(depth, per int) error {
	for {
		if s.off >= len(s.buf) {
			return s.errorf("body ends inside a list or map")
		}
		if s.buf[s.off] == 'Z' {
			s.off++
			return nil
		}
		for range per {
			if err := s.value(depth + 1); err != nil {
				return err
			}
		}
	}
}
