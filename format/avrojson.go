package format

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// convertAvro converts v, a JSON value (parseJSON's), to what hamba/avro
// encodes for schema s: records and maps as map[string]any, unions as a
// one-entry map naming the branch, timestamps and dates as time.Time,
// decimals as *big.Rat. It refuses anything that would not be the same
// value: a field the schema lacks, a number out of range or with a
// fraction where an integer goes, a decimal with more digits than its
// scale, a uuid that is not one. path names the place in errors.
func convertAvro(s avro.Schema, v any, path string) (any, error) {
	switch s := s.(type) {
	case *avro.RefSchema:
		return convertAvro(s.Schema(), v, path)
	case *avro.NullSchema:
		if v != nil {
			return nil, mismatch(path, "null", v)
		}
		return nil, nil
	case *avro.PrimitiveSchema:
		return convertPrimitive(s, v, path)
	case *avro.RecordSchema:
		return convertRecord(s, v, path)
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch(path, "enum "+s.FullName(), v)
		}
		for _, sym := range s.Symbols() {
			if sym == str {
				return str, nil
			}
		}
		return nil, fmt.Errorf("%s: %q is not a symbol of enum %s", path, str, s.FullName())
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return nil, mismatch(path, "array", v)
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			c, err := convertAvro(s.Items(), e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch(path, "map", v)
		}
		out := make(map[string]any, len(obj))
		for k, e := range obj {
			c, err := convertAvro(s.Values(), e, path+"."+k)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case *avro.FixedSchema:
		return convertFixed(s, v, path)
	case *avro.UnionSchema:
		return convertUnion(s, v, path)
	}
	return nil, fmt.Errorf("%s: schema type %s is not supported", path, s.Type())
}

// convertRecord takes a JSON object with the record's fields; a missing
// field takes its default, an unknown one is an error.
func convertRecord(s *avro.RecordSchema, v any, path string) (any, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, mismatch(path, "record "+s.FullName(), v)
	}
	out := make(map[string]any, len(s.Fields()))
	known := make(map[string]bool, len(s.Fields()))
	for _, f := range s.Fields() {
		known[f.Name()] = true
		fv, present := obj[f.Name()]
		if !present {
			if !f.HasDefault() {
				return nil, fmt.Errorf("%s.%s: missing, and the field has no default", path, f.Name())
			}
			d, err := avroDefault(f.Type(), f.Default())
			if err != nil {
				return nil, fmt.Errorf("%s.%s: default: %w", path, f.Name(), err)
			}
			out[f.Name()] = d
			continue
		}
		c, err := convertAvro(f.Type(), fv, path+"."+f.Name())
		if err != nil {
			return nil, err
		}
		out[f.Name()] = c
	}
	for name := range obj {
		if !known[name] {
			return nil, fmt.Errorf("%s.%s: the schema (record %s) has no such field", path, name, s.FullName())
		}
	}
	return out, nil
}

// convertFixed takes bytes of the fixed size (as avroBytes reads them), or
// a decimal for a fixed decimal.
func convertFixed(s *avro.FixedSchema, v any, path string) (any, error) {
	if l := s.Logical(); l != nil && l.Type() == avro.Decimal {
		return convertDecimal(l.(*avro.DecimalLogicalSchema), v, path)
	}
	b, err := avroBytes(v, path)
	if err != nil {
		return nil, err
	}
	if len(b) != s.Size() {
		return nil, fmt.Errorf("%s: fixed %s takes %d bytes, got %d", path, s.FullName(), s.Size(), len(b))
	}
	arr := reflect.New(reflect.ArrayOf(s.Size(), reflect.TypeFor[byte]())).Elem()
	reflect.Copy(arr, reflect.ValueOf(b))
	return arr.Interface(), nil
}

// convertUnion takes the branch a one-entry object names (Avro's JSON
// encoding, {"string": "x"}), else the first branch the value fits.
func convertUnion(s *avro.UnionSchema, v any, path string) (any, error) {
	types := s.Types()
	if obj, ok := v.(map[string]any); ok && len(obj) == 1 {
		for name, inner := range obj {
			for _, t := range types {
				if branchName(t) == name || shortName(t) == name {
					c, err := convertAvro(t, inner, path)
					if err != nil {
						return nil, err
					}
					return map[string]any{branchName(t): c}, nil
				}
			}
		}
	}
	var errs []string
	for _, t := range types {
		c, err := convertAvro(t, v, path)
		if err == nil {
			return map[string]any{branchName(t): c}, nil
		}
		errs = append(errs, err.Error())
	}
	return nil, fmt.Errorf("%s: fits no branch of the union (%s)", path, strings.Join(errs, "; "))
}

// branchName is the name hamba/avro finds a union branch by.
func branchName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	name := string(s.Type())
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		name += "." + string(l.Logical().Type())
	}
	return name
}

// shortName is a named branch's name without its namespace, which Avro's
// JSON encoders also accept.
func shortName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.Name()
	}
	return string(s.Type())
}

// avroDefault is a missing field's default as hamba/avro encodes it
// (hamba parsed it already; a union's default is of its first branch).
func avroDefault(s avro.Schema, d any) (any, error) {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if u, ok := s.(*avro.UnionSchema); ok {
		first := u.Types()[0]
		if first.Type() == avro.Null {
			return map[string]any{"null": nil}, nil
		}
		inner, err := avroDefault(first, d)
		if err != nil {
			return nil, err
		}
		return map[string]any{branchName(first): inner}, nil
	}
	return d, nil
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// convertPrimitive takes the JSON value for a primitive type, checked
// against its logical type (a date, a timestamp, a uuid, a decimal).
func convertPrimitive(s *avro.PrimitiveSchema, v any, path string) (any, error) {
	var logical avro.LogicalType
	if l := s.Logical(); l != nil {
		logical = l.Type()
	}
	switch s.Type() {
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, mismatch(path, "boolean", v)
		}
		return b, nil
	case avro.Int:
		return convertInt(logical, v, path)
	case avro.Long:
		return convertLong(logical, v, path)
	case avro.Float, avro.Double:
		return convertFloat(s.Type(), v, path)
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch(path, "string", v)
		}
		if logical == avro.UUID && !uuidRE.MatchString(str) {
			return nil, fmt.Errorf("%s: %q is not a uuid", path, str)
		}
		return str, nil
	case avro.Bytes:
		if logical == avro.Decimal {
			return convertDecimal(s.Logical().(*avro.DecimalLogicalSchema), v, path)
		}
		return avroBytes(v, path)
	}
	return nil, fmt.Errorf("%s: type %s is not supported", path, s.Type())
}

// convertInt takes an int: a date (YYYY-MM-DD or days since the epoch), a
// time of day in milliseconds, or a 32-bit integer.
func convertInt(logical avro.LogicalType, v any, path string) (any, error) {
	switch logical {
	case avro.Date:
		if str, ok := v.(string); ok {
			t, err := time.Parse(time.DateOnly, str)
			if err != nil {
				return nil, fmt.Errorf("%s: date %q: want YYYY-MM-DD", path, str)
			}
			return t, nil
		}
		n, err := integer(v, path, math.MinInt32, math.MaxInt32)
		if err != nil {
			return nil, err
		}
		return time.Unix(n*86400, 0).UTC(), nil
	case avro.TimeMillis:
		return convertTimeOfDay(v, path, time.Millisecond)
	}
	n, err := integer(v, path, math.MinInt32, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	return int32(n), nil
}

// convertLong takes a long: a timestamp (RFC 3339, or milli- or
// microseconds since the epoch), a time of day in microseconds, or a 64-bit
// integer.
func convertLong(logical avro.LogicalType, v any, path string) (any, error) {
	switch logical {
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		unit := time.Millisecond
		if logical == avro.TimestampMicros || logical == avro.LocalTimestampMicros {
			unit = time.Microsecond
		}
		if str, ok := v.(string); ok {
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil {
				return nil, fmt.Errorf("%s: timestamp %q: want RFC 3339 (2006-01-02T15:04:05Z07:00)", path, str)
			}
			if t.Truncate(unit) != t {
				return nil, fmt.Errorf("%s: timestamp %q is finer than the schema's %s", path, str, logical)
			}
			return t.UTC(), nil
		}
		n, err := integer(v, path, math.MinInt64, math.MaxInt64)
		if err != nil {
			return nil, err
		}
		if unit == time.Millisecond {
			return time.UnixMilli(n).UTC(), nil
		}
		return time.UnixMicro(n).UTC(), nil
	case avro.TimeMicros:
		return convertTimeOfDay(v, path, time.Microsecond)
	}
	n, err := integer(v, path, math.MinInt64, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// convertTimeOfDay takes a time of day in unit (a millisecond or a
// microsecond): HH:MM:SS[.fraction], truncated to unit, or a count of units
// since midnight.
func convertTimeOfDay(v any, path string, unit time.Duration) (any, error) {
	if str, ok := v.(string); ok {
		d, err := timeOfDay(str, path)
		if err != nil {
			return nil, err
		}
		return d.Truncate(unit), nil
	}
	n, err := integer(v, path, 0, int64(24*time.Hour/unit)-1)
	if err != nil {
		return nil, err
	}
	return time.Duration(n) * unit, nil
}

// convertFloat takes a JSON number in range for a float or a double (t).
func convertFloat(t avro.Type, v any, path string) (any, error) {
	num, ok := v.(json.Number)
	if !ok {
		return nil, mismatch(path, string(t), v)
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return nil, fmt.Errorf("%s: %s is out of range for %s", path, num, t)
	}
	if t == avro.Float {
		if math.Abs(f) > math.MaxFloat32 {
			return nil, fmt.Errorf("%s: %s is out of range for float", path, num)
		}
		return float32(f), nil
	}
	return f, nil
}

// convertDecimal takes a JSON number or a string holding one; more
// fraction digits than the scale, or more digits than the precision, is
// an error, never a rounding.
func convertDecimal(d *avro.DecimalLogicalSchema, v any, path string) (any, error) {
	var text string
	switch v := v.(type) {
	case json.Number:
		text = string(v)
	case string:
		text = v
	default:
		return nil, mismatch(path, "decimal (a number, or a string holding one)", v)
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok || strings.ContainsAny(text, "/") {
		return nil, fmt.Errorf("%s: %q is not a decimal number", path, text)
	}
	scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)))
	if !scaled.IsInt() {
		return nil, fmt.Errorf("%s: %s has more than the schema's %d decimal places", path, text, d.Scale())
	}
	if digits := len(new(big.Int).Abs(scaled.Num()).String()); d.Precision() > 0 && digits > d.Precision() && scaled.Num().Sign() != 0 {
		return nil, fmt.Errorf("%s: %s has more than the schema's precision of %d digits", path, text, d.Precision())
	}
	return r, nil
}

// avroBytes takes a string as Avro's JSON encoding writes bytes: each
// character one byte (U+0000–U+00FF).
func avroBytes(v any, path string) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, mismatch(path, "bytes (a string)", v)
	}
	b := make([]byte, 0, len(str))
	for _, r := range str {
		if r > 0xFF {
			return nil, fmt.Errorf("%s: bytes are written as characters U+0000–U+00FF, %q is not", path, r)
		}
		b = append(b, byte(r))
	}
	return b, nil
}

func timeOfDay(s, path string) (time.Duration, error) {
	t, err := time.Parse("15:04:05.999999999", s)
	if err != nil {
		return 0, fmt.Errorf("%s: time %q: want HH:MM:SS[.fraction]", path, s)
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
		time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond()), nil
}

func integer(v any, path string, lo, hi int64) (int64, error) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, mismatch(path, "integer", v)
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %s is not an integer in [%d, %d]", path, num, lo, hi)
	}
	return n, nil
}

func mismatch(path, want string, v any) error {
	return fmt.Errorf("%s: want %s, got %s", path, want, jsonKind(v))
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
