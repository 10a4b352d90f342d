package kubeletplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/health"
)

// FileHealthSource reads health events appended to a file, one JSON object
// a line:
//
//	{"device":"gpu-1","kind":"xid","xid":79,"message":"injected"}
//	{"uuid":"GPU-...","kind":"gpu-lost"}
//	{"device":"gpu-1","kind":"recovered"}
//
// It is how tests make a simulated GPU unhealthy and healthy again, and
// how an operator clears a GPU after resetting it (a "recovered" line
// without "condition" clears every condition of the GPU). Like tail -f it
// starts at the end of the file: lines written before the plugin started
// were applied then, and their result is kept in the plugin's health
// state. A file that shrinks (truncated, replaced) is read from its start.
type FileHealthSource struct {
	Path string
	// PollInterval is how often the file is checked (default 1s).
	PollInterval time.Duration
	// now stamps events (tests).
	now func() time.Time
}

// injectedEvent is one line of the file.
type injectedEvent struct {
	Device    string `json:"device"`
	UUID      string `json:"uuid"`
	Kind      string `json:"kind"`
	XID       uint64 `json:"xid"`
	Condition string `json:"condition"`
	Message   string `json:"message"`
}

// ParseInjectedEvent parses one line of the injected-events file.
func ParseInjectedEvent(line []byte) (health.Event, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var in injectedEvent
	if err := dec.Decode(&in); err != nil {
		return health.Event{}, fmt.Errorf("not a health event object: %w", err)
	}
	kind, err := health.ParseKind(in.Kind)
	if err != nil {
		return health.Event{}, fmt.Errorf("field kind: %w", err)
	}
	switch {
	case in.Device == "" && in.UUID == "":
		return health.Event{}, errors.New("field device or uuid: one is required")
	case kind == health.KindXID && in.XID == 0:
		return health.Event{}, errors.New(`field xid: required for kind "xid"`)
	case kind != health.KindXID && in.XID != 0:
		return health.Event{}, fmt.Errorf("field xid: %d given for kind %q, only kind \"xid\" has one", in.XID, kind)
	case kind != health.KindRecovered && in.Condition != "":
		return health.Event{}, fmt.Errorf("field condition: %q given for kind %q, only kind \"recovered\" clears a condition", in.Condition, kind)
	}
	return health.Event{Device: in.Device, UUID: in.UUID, Kind: kind, XID: in.XID, Condition: in.Condition, Message: in.Message}, nil
}

// Name implements HealthSource.
func (s *FileHealthSource) Name() string { return "file " + s.Path }

// Run implements HealthSource. A missing file is no event yet; a line
// that does not parse is logged with its number and skipped.
func (s *FileHealthSource) Run(ctx context.Context, sink HealthSink) error {
	logger := klog.FromContext(ctx).WithValues("file", s.Path)
	interval := s.PollInterval
	if interval <= 0 {
		interval = time.Second
	}
	now := s.now
	if now == nil {
		now = time.Now
	}
	t := &fileTail{path: s.Path}
	if err := t.skipToEnd(); err != nil {
		return err
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		lines, err := t.read()
		if err != nil {
			// A file we cannot read makes injected events and operator
			// clears impossible, which the liveness check should show.
			sink.SourceFailing(err)
		} else {
			sink.SourceFailing(nil)
		}
		for _, l := range lines {
			e, err := ParseInjectedEvent(l.text)
			if err != nil {
				logger.Error(err, "Ignoring a bad line of the health events file", "line", l.number, "text", string(l.text))
				continue
			}
			e.Time = now()
			sink.Report(e)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// fileTail reads complete lines appended to a file.
type fileTail struct {
	path   string
	offset int64
	line   int
}

type numberedLine struct {
	number int
	text   []byte
}

func (t *fileTail) skipToEnd() error {
	data, err := os.ReadFile(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading health events file: %w", err)
	}
	// Only complete lines count as read; a partial last line is read
	// once its writer finishes it.
	end := bytes.LastIndexByte(data, '\n') + 1
	t.offset = int64(end)
	t.line = bytes.Count(data[:end], []byte{'\n'})
	return nil
}

func (t *fileTail) read() ([]numberedLine, error) {
	f, err := os.Open(t.path)
	if errors.Is(err, os.ErrNotExist) {
		t.offset, t.line = 0, 0
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening health events file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("health events file: %w", err)
	}
	if st.Size() < t.offset {
		t.offset, t.line = 0, 0
	}
	if st.Size() == t.offset {
		return nil, nil
	}
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("health events file: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, st.Size()-t.offset))
	if err != nil {
		return nil, fmt.Errorf("reading health events file: %w", err)
	}
	end := bytes.LastIndexByte(data, '\n') + 1
	var out []numberedLine
	for _, l := range bytes.SplitAfter(data[:end], []byte{'\n'}) {
		if len(l) == 0 {
			continue
		}
		t.line++
		if l = bytes.TrimSpace(l); len(l) > 0 {
			out = append(out, numberedLine{number: t.line, text: l})
		}
	}
	t.offset += int64(end)
	return out, nil
}
