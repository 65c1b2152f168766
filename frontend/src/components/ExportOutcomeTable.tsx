import { formatFloat } from '../format'
import type { FormatOutcome } from '../types'

const LEFT_OUT = ['failed', 'not made']

/** A format's name in words: merged, gguf-q8_0, adapter. */
export function formatLabel(name: string): string {
  if (name === 'merged') return 'Merged model'
  if (name === 'adapter') return 'LoRA adapter'
  return name.startsWith('gguf-') ? `GGUF ${name.slice(5)}` : name
}

/**
 * The formats an export left out, as a table: each format with the figures its check missed (what
 * was measured, the bound it had to stay within, what the miss means) and what to do instead. A
 * format that was not made (a GGUF of a merged model that failed) says why in place of figures.
 */
export function ExportOutcomeTable({ formats }: { formats: Record<string, FormatOutcome> }) {
  const leftOut = Object.entries(formats).filter(([, outcome]) => LEFT_OUT.includes(outcome.status))
  if (leftOut.length === 0) return null
  return (
    <table className="table table--compact export-outcome" aria-label="Formats left out" data-testid="export-outcome">
      <thead>
        <tr>
          <th scope="col">Format</th><th scope="col">Figure</th><th scope="col" className="num">Measured</th>
          <th scope="col" className="num">Bound</th><th scope="col">What it means</th><th scope="col">What to do</th>
        </tr>
      </thead>
      <tbody>
        {leftOut.flatMap(([name, outcome]) => {
          const missed = (outcome.figures ?? []).filter((figure) => !figure.passed)
          const advice = <td rowSpan={Math.max(missed.length, 1)}>{outcome.advice ?? ''}</td>
          const format = <th scope="row" rowSpan={Math.max(missed.length, 1)}>{formatLabel(name)}</th>
          if (missed.length === 0) {
            return [<tr key={name}>{format}<td>{outcome.status}</td><td className="num">—</td><td className="num">—</td><td>{outcome.reason ?? ''}</td>{advice}</tr>]
          }
          return missed.map((figure, index) => (
            <tr key={`${name}-${figure.figure}`}>
              {index === 0 && format}
              <td>{figure.figure}</td>
              <td className="num mono error-text">{formatFloat(figure.measured)}</td>
              <td className="num mono">{figure.within === 'at least' ? '≥' : '≤'} {formatFloat(figure.bound)}</td>
              <td>{figure.meaning}</td>
              {index === 0 && advice}
            </tr>
          ))
        })}
      </tbody>
    </table>
  )
}
