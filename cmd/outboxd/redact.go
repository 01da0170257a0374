package main

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Redaction works on what a value means, not on how it starts: config check
// goes to the journal (systemd's ExecStartPre), so a password must not reach
// it through a leading space, an upper-case scheme, a typo in the scheme or a
// URL in a flag that is not a secret itself. Three rules:
//
//   - a secret flag (a password) is never shown, but through a redactor its
//     table entry names: in --pg-dsn (redactDSN), the password of a URL (any
//     scheme, any case, around spaces) or of key=value pairs is replaced,
//     and a value that is neither is not shown at all: it cannot be told
//     apart from a password;
//   - in every other value, the password of any URL in it is replaced.

// redacted is what stands for a secret in output.
const redacted = "REDACTED"

// notShown stands for a secret-bearing value that cannot be parsed.
const notShown = "(not shown: it holds a secret and cannot be parsed)"

// quoteSetting quotes a value for an error message, secrets redacted.
func quoteSetting(name, v string) string {
	if s, ok := allSettings()[name]; ok && s.secret {
		return "(value not shown: secret)"
	}
	return fmt.Sprintf("%q", redactSetting(name, v))
}

// redactSetting returns the value of flag name fit for output.
func redactSetting(name, v string) string {
	s, ok := allSettings()[name]
	switch {
	case !ok:
	case s.redact != nil:
		return s.redact(v)
	case s.secret && v != "":
		return redacted
	}
	return redactURLs(v)
}

var (
	dsnPasswordKV = regexp.MustCompile(`(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)
	// urlScheme is where a URL starts, in any case: scheme "://".
	urlScheme = regexp.MustCompile(`(?i)^[a-z][a-z0-9+.\-]*://`)
	// userinfo is the user:password@ of a URL anywhere in a value.
	userinfo = regexp.MustCompile(`(?i)([a-z][a-z0-9+.\-]*://[^/?#@\s,]*?:)[^/?#\s,]*@`)
)

// redactDSN replaces the password (and sslpassword) of a PostgreSQL
// connection string, in URL or keyword/value form, with REDACTED; a value
// that is neither is not shown.
func redactDSN(dsn string) string {
	trimmed := strings.TrimSpace(dsn)
	switch {
	case trimmed == "":
		return dsn
	case urlScheme.MatchString(trimmed):
		u, err := url.Parse(trimmed)
		if err != nil {
			return notShown
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
		q := u.Query()
		changed := false
		for k := range q {
			if strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword") {
				q.Set(k, redacted)
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
		return u.String()
	case strings.Contains(trimmed, "=") && !strings.Contains(trimmed, "://"):
		return dsnPasswordKV.ReplaceAllString(trimmed, "${1}"+redacted)
	}
	// "u:pw@db/app", "postgres//u:pw@db": not a connection string, and
	// nothing says where a password in it would end.
	return notShown
}

// redactURLs replaces the password of every URL in v (a list of them, or a
// URL inside other text).
func redactURLs(v string) string {
	if !strings.Contains(v, "@") {
		return v
	}
	return userinfo.ReplaceAllString(v, "${1}"+redacted+"@")
}
