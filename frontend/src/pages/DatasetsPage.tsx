import { EmptyState } from '../components/EmptyState'
import { PageHeader } from '../components/PageHeader'

export function DatasetsPage() {
  return (
    <>
      <PageHeader
        title="Datasets"
        description="Training data uploaded to this box, with a preview of its rows and their length in tokens."
      />
      <EmptyState title="No datasets yet">
        <p>Uploaded datasets will be listed here with their size, columns and chat format.</p>
      </EmptyState>
    </>
  )
}
