package pgserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// initdbArgs are initdb's arguments after "-D dir": every cluster is made
// alike, so that one made once serves as the template of the next.
var initdbArgs = []string{"-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"}

// makeCluster makes the cluster in data, an empty directory the server's
// user owns: a copy of this PostgreSQL's template, kept in the user's
// cache directory, where there is one; else by initdb, whose cluster then
// becomes the template. initdb costs a start 1.3 s of CPU and as much
// time; the copy, a tenth of it. A template that cannot be kept or read
// only costs the start an initdb.
func (s *Server) makeCluster(bin, data string, attr *syscall.SysProcAttr) error {
	tmpl, tmplErr := templateDir(bin, attr)
	if tmplErr == nil {
		if err := copyTree(tmpl, data, attr); err == nil {
			return nil
		}
		// A template half copied is no cluster: start again from empty.
		if err := emptyDir(data); err != nil {
			return err
		}
	}
	initdb := s.command(attr, filepath.Join(bin, "initdb"), append([]string{"-D", data}, initdbArgs...)...)
	if err := initdb.Run(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, s.log)
	}
	if tmpl != "" && errors.Is(tmplErr, fs.ErrNotExist) {
		keepTemplate(data, tmpl)
	}
	return nil
}

// templateDir is where the template of the cluster that bin's initdb makes
// for attr's user is kept: named by what makes it (the binaries, by path,
// size and time, the arguments, the user), so that another PostgreSQL
// never uses it. Its error wraps fs.ErrNotExist where there is no template
// yet, and the path is then where to keep one.
func templateDir(bin string, attr *syscall.SysProcAttr) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", bin, strings.Join(initdbArgs, " "))
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(bin, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d %d\n", name, fi.Size(), fi.ModTime().UnixNano())
	}
	if attr != nil && attr.Credential != nil {
		fmt.Fprintf(h, "%d:%d\n", attr.Credential.Uid, attr.Credential.Gid)
	}
	dir := filepath.Join(cache, "turncheck", "pgserver", hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		return dir, err
	}
	return dir, nil
}

// keepTemplate copies the cluster in data, just made, to tmpl: into a
// directory beside it, renamed into place whole, so that a start that
// runs at once in another process finds a whole template or none. A
// failure keeps nothing, and the next start makes its own cluster again.
func keepTemplate(data, tmpl string) {
	if err := os.MkdirAll(filepath.Dir(tmpl), 0o700); err != nil {
		return
	}
	tmp, err := os.MkdirTemp(filepath.Dir(tmpl), "new-*")
	if err != nil {
		return
	}
	if copyTree(data, tmp, nil) != nil || os.Rename(tmp, tmpl) != nil {
		// Another process kept its template first, or the copy failed.
		_ = os.RemoveAll(tmp)
	}
}

// copyTree copies the directory tree src into dst, an existing directory,
// with the modes of src, owned by attr's user where it names one. A
// cluster holds directories and regular files alone.
func copyTree(src, dst string, attr *syscall.SysProcAttr) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case rel == ".":
			err = os.Chmod(dst, fi.Mode().Perm())
		case d.IsDir():
			err = os.Mkdir(target, fi.Mode().Perm())
		case d.Type().IsRegular():
			err = copyFile(path, target, fi.Mode().Perm())
		default:
			return fmt.Errorf("%s: neither a directory nor a regular file", path)
		}
		if err == nil && attr != nil && attr.Credential != nil {
			err = os.Chown(target, int(attr.Credential.Uid), int(attr.Credential.Gid))
		}
		return err
	})
}

// copyFile copies the regular file src to dst, a new file of mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// emptyDir removes everything in dir, and leaves dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
