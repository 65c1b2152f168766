import { useEffect, useRef } from 'react'
import uPlot from 'uplot'
import 'uplot/dist/uPlot.min.css'

export interface ChartSeries {
  label: string
  /** Any CSS colour; canvas needs a concrete value, not var(--…). */
  color: string
}

export interface LiveChartProps {
  title: string
  /** Column-oriented, as uPlot wants it: [x values, ...one array per series]. */
  data: uPlot.AlignedData
  series: ChartSeries[]
  /** Label of the x axis; x values are plain numbers (training step), not timestamps. */
  xLabel?: string
  height?: number
}

const FALLBACK_WIDTH = 600

// uPlot gives an empty scale no range and then draws no axes; keep a frame on screen until
// the first points arrive, and let uPlot's own padding take over after.
const xRange: uPlot.Range.Function = (_u, min, max) => (min == null || max == null ? [0, 100] : [min, max])
const yRange: uPlot.Range.Function = (_u, min, max) =>
  min == null || max == null ? [0, 1] : uPlot.rangeNum(min, max, 0.1, true)

/**
 * A uPlot line chart sized to its container. uPlot draws on a canvas and is made for
 * streaming: new points go through setData() without rebuilding the chart.
 */
export function LiveChart({ title, data, series, xLabel = 'step', height = 220 }: LiveChartProps) {
  const containerRef = useRef<HTMLDivElement>(null)
  const plotRef = useRef<uPlot | null>(null)
  // The chart is built once per series layout; later data arrives through setData().
  const dataRef = useRef(data)
  dataRef.current = data
  const seriesKey = series.map((s) => `${s.label}:${s.color}`).join('|')

  useEffect(() => {
    const container = containerRef.current
    if (!container) return
    const options: uPlot.Options = {
      width: container.clientWidth || FALLBACK_WIDTH,
      height,
      legend: { show: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false, range: xRange }, y: { range: yRange } },
      axes: [{ label: xLabel }, {}],
      series: [
        { label: xLabel },
        ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, points: { show: false } })),
      ],
    }
    const plot = new uPlot(options, dataRef.current, container)
    plotRef.current = plot

    const observer =
      typeof ResizeObserver === 'undefined'
        ? null
        : new ResizeObserver(() => {
            const width = container.clientWidth
            if (width > 0) plot.setSize({ width, height })
          })
    observer?.observe(container)

    return () => {
      observer?.disconnect()
      plot.destroy()
      plotRef.current = null
    }
    // seriesKey stands for `series`, whose identity changes on every render of the parent.
  }, [seriesKey, xLabel, height])

  useEffect(() => {
    plotRef.current?.setData(data)
  }, [data])

  const empty = (data[0]?.length ?? 0) === 0
  return (
    <figure className="chart" aria-label={title}>
      <figcaption className="chart__title">{title}</figcaption>
      <div className="chart__plot">
        <div ref={containerRef} />
        {empty && <div className="chart__empty">Waiting for data</div>}
      </div>
    </figure>
  )
}
