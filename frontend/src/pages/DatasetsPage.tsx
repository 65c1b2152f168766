import { Fragment, useState } from 'react'
import { deleteJson } from '../api'
import { mayManage, useAuth } from '../auth'
import { DatasetReport, formatName } from '../components/DatasetReport'
import { DatasetUpload } from '../components/DatasetUpload'
import { EmptyState } from '../components/EmptyState'
import { ErrorNotice, errorText } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatBytes, formatTime } from '../format'
import type { Dataset, DatasetPage } from '../types'
import { useResource } from '../useResource'

export function DatasetsPage() {
  const { user } = useAuth()
  const datasets = useResource<DatasetPage>('/api/datasets?limit=200')
  const [open, setOpen] = useState<number | null>(null)
  const [actionError, setActionError] = useState<string | null>(null)

  async function remove(dataset: Dataset) {
    if (!window.confirm(`Delete the dataset “${dataset.name}”? Its file is removed from the server.`)) return
    setActionError(null)
    try {
      await deleteJson(`/api/datasets/${dataset.id}`)
      await datasets.reload()
    } catch (err) {
      setActionError(`Could not delete “${dataset.name}”: ${errorText(err)}`)
    }
  }

  const items = datasets.data?.items ?? []
  return (
    <>
      <PageHeader
        title="Datasets"
        description="Training data uploaded to this box, with what the server found in each file."
      />
      <section className="panel" aria-labelledby="upload-heading">
        <header className="panel__header"><h2 id="upload-heading">Upload</h2></header>
        <div className="panel__body">
          <DatasetUpload onUploaded={() => void datasets.reload()} />
        </div>
      </section>
      <ErrorNotice error={actionError} />
      {datasets.error && <ErrorNotice error={`Could not load the datasets: ${datasets.error}`} />}
      {datasets.loading && !datasets.data && <p className="muted">Loading…</p>}
      {datasets.data && items.length === 0 && (
        <EmptyState title="No datasets yet">
          <p>Upload a JSONL, JSON, CSV or Parquet file above; the server checks every row.</p>
        </EmptyState>
      )}
      {items.length > 0 && (
        <section className="panel" aria-labelledby="datasets-heading">
          <header className="panel__header"><h2 id="datasets-heading">All datasets ({datasets.data?.total})</h2></header>
          <table className="table" data-testid="datasets">
            <thead>
              <tr>
                <th scope="col">Name</th><th scope="col">Format</th><th scope="col" className="num">Usable / rows</th>
                <th scope="col" className="num">Size</th><th scope="col">Uploaded</th>
                <th scope="col"><span className="visually-hidden">Actions</span></th>
              </tr>
            </thead>
            <tbody>
              {items.map((d) => (
                <Fragment key={d.id}>
                  <tr>
                    <td><span className="strong">{d.name}</span><div className="muted small mono">{d.filename}</div></td>
                    <td>{formatName(d.format)}</td>
                    <td className="num mono">{d.usable_rows} / {d.rows}</td>
                    <td className="num mono">{formatBytes(d.size_bytes)}</td>
                    <td className="nowrap">{formatTime(d.created_at)}</td>
                    <td className="num">
                      <div className="row-actions">
                        <button type="button" className="button button--small" aria-expanded={open === d.id}
                          onClick={() => setOpen(open === d.id ? null : d.id)}>
                          {open === d.id ? 'Hide report' : 'Report'}<span className="visually-hidden"> of {d.name}</span>
                        </button>
                        {mayManage(user, d.owner_id) && (
                          <button type="button" className="button button--small button--danger" onClick={() => void remove(d)}>
                            Delete<span className="visually-hidden"> {d.name}</span>
                          </button>
                        )}
                      </div>
                    </td>
                  </tr>
                  {open === d.id && (
                    <tr><td colSpan={6}><DatasetReport report={d.report} /></td></tr>
                  )}
                </Fragment>
              ))}
            </tbody>
          </table>
        </section>
      )}
    </>
  )
}
