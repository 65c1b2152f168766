/** A histogram of token lengths, split at the chosen max sequence length. */
export interface LengthBin {
  from: number
  /** Exclusive upper bound. */
  to: number
  /** Sequences in the bin that fit in the max length. */
  kept: number
  /** Sequences in the bin longer than the max length: they would be cut. */
  cut: number
}

export interface LengthHistogram {
  bins: LengthBin[]
  /** How many sequences the max length would truncate. */
  truncated: number
  total: number
  /** The largest bin's count, for scaling bars. */
  peak: number
}

/** Bins of equal width from 0 to past the longest sequence (and past the max length, to show where it falls). */
export function lengthHistogram(lengths: number[], maxSeqLen: number, binCount = 24): LengthHistogram {
  const longest = lengths.reduce((a, b) => Math.max(a, b), 0)
  const span = Math.max(longest + 1, Math.min(maxSeqLen + 1, longest * 2 + 1), 1)
  const width = Math.max(1, Math.ceil(span / binCount))
  const count = Math.ceil(span / width)
  const bins: LengthBin[] = Array.from({ length: count }, (_, i) => ({ from: i * width, to: (i + 1) * width, kept: 0, cut: 0 }))
  let truncated = 0
  for (const length of lengths) {
    const bin = bins[Math.min(Math.floor(length / width), count - 1)]!
    if (length > maxSeqLen) {
      bin.cut += 1
      truncated += 1
    } else bin.kept += 1
  }
  return { bins, truncated, total: lengths.length, peak: bins.reduce((a, b) => Math.max(a, b.kept + b.cut), 0) }
}
