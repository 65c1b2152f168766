import { Link } from 'react-router'
import { ErrorNotice } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatParameters } from '../format'
import type { Catalog, CatalogModel } from '../types'
import { useResource } from '../useResource'

function ModelTable({ models, label }: { models: CatalogModel[]; label: string }) {
  return (
    <table className="table" aria-label={label}>
      <thead>
        <tr>
          <th scope="col">Model</th><th scope="col">Family</th><th scope="col" className="num">Parameters</th>
          <th scope="col">Access</th><th scope="col"><span className="visually-hidden">Actions</span></th>
        </tr>
      </thead>
      <tbody>
        {models.map((m) => (
          <tr key={m.id}>
            <td><span className="strong">{m.name ?? m.id}</span>{m.name && <div className="muted small mono">{m.id}</div>}</td>
            <td>{m.family ?? '—'}</td>
            <td className="num mono">{formatParameters(m.parameters)}</td>
            <td>{m.gated ? <span className="badge badge--muted" title="Needs an access grant on the hub">gated</span> : m.source === 'hub' ? 'open' : 'on this server'}</td>
            <td className="num">
              <Link className="button button--small" to={`/jobs/new?model=${encodeURIComponent(m.id)}`}>Fine-tune<span className="visually-hidden"> {m.id}</span></Link>
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  )
}

export function ModelsPage() {
  const catalog = useResource<Catalog>('/api/models')
  const data = catalog.data
  return (
    <>
      <PageHeader
        title="Models"
        description="Base models available to fine-tune: the built-in one, models on this server, and the curated list."
      />
      {catalog.error && <ErrorNotice error={`Could not load the models: ${catalog.error}`} />}
      {!data && !catalog.error && <p className="muted">Loading…</p>}
      {data && (
        <>
          <section className="panel" aria-labelledby="builtin-heading">
            <header className="panel__header"><h2 id="builtin-heading">Built in</h2></header>
            <ModelTable models={[data.default]} label="Built-in model" />
          </section>
          <section className="panel" aria-labelledby="local-heading">
            <header className="panel__header"><h2 id="local-heading">On this server ({data.local.length})</h2></header>
            {data.local.length === 0 ? (
              <p className="panel__body muted">No model folders in the data directory yet. Any Hugging Face folder on the server can also be used by its path.</p>
            ) : (
              <ModelTable models={data.local} label="Models on this server" />
            )}
            <p className="panel__body muted small">Deleting models is not offered yet: the server has no endpoint for it.</p>
          </section>
          <section className="panel" aria-labelledby="curated-heading">
            <header className="panel__header"><h2 id="curated-heading">Curated ({data.curated.length})</h2></header>
            <ModelTable models={data.curated} label="Curated models" />
          </section>
        </>
      )}
    </>
  )
}
