import type { DatasetReport as Report } from '../types'

const FORMAT_NAMES: Record<string, string> = {
  messages: 'chat messages',
  conversations: 'chat conversations (ShareGPT)',
  sharegpt: 'chat conversations (ShareGPT)',
  alpaca: 'instruction / input / output (Alpaca)',
  prompt_completion: 'prompt / completion',
  text: 'raw text',
  preference: 'preference pairs (prompt / chosen / rejected)',
  kto: 'labelled answers (prompt / completion / label)',
  unpaired_preference: 'labelled answers (prompt / completion / label)',
}

export function formatName(format: string | null | undefined): string {
  if (!format) return 'not recognised'
  return FORMAT_NAMES[format] ? `${FORMAT_NAMES[format]} — ${format}` : format
}

/** What the server found in a dataset file: format, row counts, and the rows it cannot use. */
export function DatasetReport({ report, title = 'Validation report', showError = true }: { report: Report; title?: string; showError?: boolean }) {
  const bad = report.bad_rows ?? []
  const badCount = report.bad_row_count ?? bad.length
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
        {report.columns && report.columns.length > 0 && (
          <div><dt>Columns</dt><dd className="mono">{report.columns.join(', ')}</dd></div>
        )}
      </dl>
      {bad.length > 0 && (
        <table className="table table--compact" aria-label="Rows that cannot be used">
          <thead>
            <tr><th scope="col" className="num">Line</th><th scope="col">Why it cannot be used</th></tr>
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
    </section>
  )
}
