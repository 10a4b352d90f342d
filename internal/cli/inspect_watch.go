package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpulink/gpulink/driver"
)

// clearScreen moves the cursor home and clears the terminal, so each view
// replaces the previous one as `watch` does.
const clearScreen = "\x1b[H\x1b[2J"

// watchInspect shows the view, then again whenever gpulink's slices or any
// claim change, until ctx ends or the process is interrupted. It reads
// through informers (one list and one watch per resource, no polling) and
// coalesces changes: at most one view per o.watchInterval, and none while
// nothing changed.
func watchInspect(ctx context.Context, cmd *cobra.Command, o *inspectOptions, client kubernetes.Interface, server string) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Slices of other drivers are not transferred at all.
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver.Name).String()
	}))
	claimFactory := informers.NewSharedInformerFactory(client, 0)
	slices := sliceFactory.Resource().V1().ResourceSlices()
	claims := claimFactory.Resource().V1().ResourceClaims()

	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default: // a view is due anyway
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	for _, inf := range []cache.SharedIndexInformer{slices.Informer(), claims.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watching: %w", err)
		}
	}
	sliceFactory.Start(ctx.Done())
	claimFactory.Start(ctx.Done())
	defer sliceFactory.Shutdown()
	defer claimFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), slices.Informer().HasSynced, claims.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("reading ResourceSlices and ResourceClaims from %s did not complete", server)
	}
	terminal := isTerminal(cmd.OutOrStdout())
	for renders := 1; ; renders++ {
		// Drain the initial list's notifications: the view shows them.
		select {
		case <-changed:
		default:
		}
		published, err := slices.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing cached ResourceSlices: %w", err)
		}
		all, err := claims.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing cached ResourceClaims: %w", err)
		}
		if o.output != outputJSON {
			if terminal {
				fmt.Fprint(cmd.OutOrStdout(), clearScreen)
			} else if renders > 1 {
				fmt.Fprintln(cmd.OutOrStdout())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Watching %s at %s (%s), Ctrl-C to stop\n\n", server, time.Now().Format(time.TimeOnly), changeCount(renders))
		}
		if err := renderInspect(cmd, o, server, published, all, nil); err != nil {
			return err
		}
		if o.onRender != nil {
			o.onRender(renders)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		if o.watchInterval > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(o.watchInterval):
			}
		}
	}
}

func changeCount(renders int) string {
	if renders == 1 {
		return "initial view"
	}
	return fmt.Sprintf("view %d", renders)
}

// isTerminal tells whether w is a terminal (a character device), where
// views replace each other; elsewhere (a file, a pipe) they follow each
// other.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
