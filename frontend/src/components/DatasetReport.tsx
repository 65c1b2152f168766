import type { DatasetReport as Report } from '../types'

const FORMAT_NAMES: Record<string, string> = {
  messages: 'chat messages',
  conversations: 'chat conversations (ShareGPT)',
  sharegpt: 'chat conversations (ShareGPT)',
  alpaca: 'instruction / input / output (Alpaca)',
  prompt_completion: 'prompt / completion',
  text: 'raw text',
  preference: 'preference pairs (prompt / chosen / rejected, or two whole conversations)',
  kto: 'labelled answers (prompt / completion / label)',
  unpaired_preference: 'labelled answers (prompt / completion / label)',
  prompt: 'prompts to answer, with reference columns (GRPO)',
}

export function formatName(format: string | null | undefined): string {
  if (!format) return 'not recognised'
  return FORMAT_NAMES[format] ? `${FORMAT_NAMES[format]} — ${format}` : format
}

/** "Line" for a text file, "Row" for parquet: what the report's numbers count. */
export function numberedByName(numberedBy: string | null | undefined): string {
  return numberedBy === 'row' ? 'Row' : 'Line'
}

/**
 * What the server found in a dataset file: format, row counts, how it was read, the rows it cannot
 * use (every problem of each, blank lines included) and the warnings of rows it uses.
 */
export function DatasetReport({ report, title = 'Validation report', showError = true }: { report: Report; title?: string; showError?: boolean }) {
  const bad = report.bad_rows ?? []
  const badCount = report.bad_row_count ?? bad.length
  const warnings = report.warnings ?? []
  const warningCount = report.warning_count ?? warnings.length
  const unit = numberedByName(report.numbered_by)
  return (
    <section className="report" aria-label={title} data-testid="dataset-report">
      <h3 className="report__title">{title}</h3>
      {showError && report.error && <p className="error-text" role="alert">{report.error}</p>}
      <dl className="facts">
        <div><dt>Detected format</dt><dd data-testid="report-format">{formatName(report.format)}</dd></div>
        {report.task && <div><dt>Task</dt><dd>{report.task}</dd></div>}
        <div><dt>Rows</dt><dd className="mono" data-testid="report-rows">{report.rows ?? 0}</dd></div>
        <div><dt>Usable rows</dt><dd className="mono" data-testid="report-usable">{report.usable_rows ?? 0}</dd></div>
        <div><dt>Bad rows</dt><dd className={`mono${badCount ? ' error-text' : ''}`} data-testid="report-bad">{badCount}</dd></div>
        {warningCount > 0 && <div><dt>Warnings</dt><dd className="mono warning-text" data-testid="report-warnings">{warningCount}</dd></div>}
        {report.columns && report.columns.length > 0 && (
          <div><dt>Columns</dt><dd className="mono">{report.columns.map((c) => JSON.stringify(c)).join(', ')}</dd></div>
        )}
      </dl>
      {(report.notes ?? []).map((note) => <p key={note} className="notice small">{note}</p>)}
      {bad.length > 0 && (
        <table className="table table--compact" aria-label="Rows that cannot be used">
          <thead>
            <tr><th scope="col" className="num">{unit}</th><th scope="col">Why it cannot be used</th></tr>
          </thead>
          <tbody>
            {bad.map((row, index) => (
              <tr key={`${row.line}-${index}`}>
                <td className="num mono">{row.line}</td>
                <td>{row.reason}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {badCount > bad.length && <p className="muted small">…and {badCount - bad.length} more bad rows.</p>}
      {warnings.length > 0 && (
        <table className="table table--compact" aria-label="Warnings of rows that are used">
          <thead>
            <tr><th scope="col" className="num">{unit}</th><th scope="col">Used, but</th></tr>
          </thead>
          <tbody>
            {warnings.map((row, index) => (
              <tr key={`${row.line}-${index}`}>
                <td className="num mono">{row.line}</td>
                <td className="warning-text">{row.message}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {warningCount > warnings.length && <p className="muted small">…and {warningCount - warnings.length} more warnings.</p>}
    </section>
  )
}
