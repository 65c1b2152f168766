import { EmptyState } from '../components/EmptyState'
import { PageHeader } from '../components/PageHeader'

export function ModelsPage() {
  return (
    <>
      <PageHeader
        title="Models"
        description="Base models available to fine-tune, with their size, architecture and memory needs."
      />
      <EmptyState title="No models listed yet">
        <p>The built-in SmolLM2-135M-Instruct and models imported from local files will appear here.</p>
      </EmptyState>
    </>
  )
}
