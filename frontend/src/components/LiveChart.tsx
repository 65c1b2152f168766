import { useEffect, useRef } from 'react'
import uPlot from 'uplot'
import 'uplot/dist/uPlot.min.css'

export interface ChartSeries {
  label: string
  /** Any CSS colour; canvas needs a concrete value, not var(--…). */
  color: string
  /** Draw a line across missing points (sparse series such as eval loss). */
  spanGaps?: boolean
  /** Show a dot on each point (sparse series). */
  points?: boolean
  dash?: number[]
}

export interface LiveChartProps {
  title: string
  /** Column-oriented, as uPlot wants it: [x values, ...one array per series]. */
  data: uPlot.AlignedData
  series: ChartSeries[]
  /** Label of the x axis. */
  xLabel?: string
  /** Formats x values on the axis and in the legend (e.g. seconds as m:ss). */
  xFormat?: (value: number) => string
  /** Formats y values in the legend. */
  yFormat?: (value: number) => string
  /** Formats the y axis ticks (e.g. a learning rate of 2e-4, which plain ticks would round to 0). */
  yTickFormat?: (value: number) => string
  /** Charts with the same key move their cursors together. */
  syncKey?: string
  /** Shared x range, so charts of one job line up on the same axis. */
  xDomain?: [number, number] | null
  /** A fixed y range (e.g. 0–100 %); otherwise it follows the data. */
  yDomain?: [number, number]
  height?: number
  testId?: string
}

const FALLBACK_WIDTH = 600

/**
 * A uPlot line chart sized to its container. uPlot draws on a canvas and is made for
 * streaming: new points go through setData() without rebuilding the chart.
 */
export function LiveChart({
  title, data, series, xLabel = 'step', xFormat, yFormat, yTickFormat, syncKey, xDomain, yDomain, height = 200, testId,
}: LiveChartProps) {
  const containerRef = useRef<HTMLDivElement>(null)
  const plotRef = useRef<uPlot | null>(null)
  // The chart is built once per series layout; later data arrives through setData().
  const dataRef = useRef(data)
  dataRef.current = data
  const domainRef = useRef(xDomain)
  domainRef.current = xDomain
  const formatRef = useRef({ xFormat, yFormat, yTickFormat })
  formatRef.current = { xFormat, yFormat, yTickFormat }
  const seriesKey = series.map((s) => `${s.label}:${s.color}`).join('|')
  const yKey = yDomain ? yDomain.join(',') : ''

  useEffect(() => {
    const container = containerRef.current
    if (!container) return
    // uPlot gives an empty scale no range and then draws no axes; keep a frame on screen until
    // the first points arrive.
    const xRange: uPlot.Range.Function = (_u, min, max) => {
      const domain = domainRef.current
      if (domain) return [domain[0], Math.max(domain[1], domain[0] + 1)]
      return min == null || max == null ? [0, 100] : [min, max === min ? min + 1 : max]
    }
    const yRange: uPlot.Range.Function = (_u, min, max) => {
      if (yDomain) return [yDomain[0], Math.max(yDomain[1], max ?? 0)]
      if (min == null || max == null) return [0, 1]
      // A flat series (a learning rate of 0 during warmup, a constant rate) has no span to
      // pad; give it one, or the axis has no ticks to draw.
      if (min === max) return min === 0 ? [0, 1] : [min - Math.abs(min) * 0.5, max + Math.abs(max) * 0.5]
      return uPlot.rangeNum(min, max, 0.1, true)
    }
    const fx = (v: number) => (formatRef.current.xFormat ? formatRef.current.xFormat(v) : String(v))
    const fy = (v: number | null) => (v == null ? '—' : formatRef.current.yFormat ? formatRef.current.yFormat(v) : String(v))
    const options: uPlot.Options = {
      width: container.clientWidth || FALLBACK_WIDTH,
      height,
      legend: { show: true },
      cursor: { drag: { x: true, y: false }, sync: syncKey ? { key: syncKey } : undefined },
      scales: { x: { time: false, range: xRange }, y: { range: yRange } },
      axes: [
        { label: xLabel, values: (_u, splits) => splits.map((v) => fx(v)) },
        {
          size: 60,
          values: (_u, splits) =>
            splits.map((v) => (formatRef.current.yTickFormat ? formatRef.current.yTickFormat(v) : String(Number(v.toPrecision(6))))),
        },
      ],
      series: [
        { label: xLabel, value: (_u, v) => (v == null ? '—' : fx(v)) },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 1.5,
          spanGaps: s.spanGaps ?? false,
          dash: s.dash,
          // Left unset, uPlot shows the points only while they are few and far apart (a lone
          // first step is a dot, not nothing); sparse series show them always.
          points: s.points ? { show: true, size: 5, fill: s.color } : { size: 5, fill: s.color },
          value: (_u: uPlot, v: number | null) => fy(v),
        })),
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
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [seriesKey, xLabel, height, syncKey, yKey])

  useEffect(() => {
    plotRef.current?.setData(data)
  }, [data, xDomain?.[0], xDomain?.[1]])

  const points = data[0]?.length ?? 0
  return (
    <figure className="chart" aria-label={title} data-testid={testId} data-points={points}>
      <figcaption className="chart__title">{title}</figcaption>
      <div className="chart__plot">
        <div ref={containerRef} />
        {points === 0 && <div className="chart__empty">Waiting for data</div>}
      </div>
    </figure>
  )
}
