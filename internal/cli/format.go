package cli

import (
	"strconv"
	"strings"
)

// formatIndices writes GPU indices compactly, collapsing runs of three or
// more consecutive indices: [0 1 2 3 6] -> "0-3,6".
func formatIndices(idx []int) string {
	if len(idx) == 0 {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(idx[i]))
		switch {
		case j-i >= 2:
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(idx[j]))
		case j == i+1:
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(idx[j]))
		}
		i = j + 1
	}
	return b.String()
}

// orDash shows an empty table cell as "-" so columns stay readable.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
