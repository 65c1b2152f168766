import { EmptyState } from '../components/EmptyState'
import { PageHeader } from '../components/PageHeader'

export function ArtifactsPage() {
  return (
    <>
      <PageHeader
        title="Artifacts"
        description="What finished jobs produced — LoRA adapters, merged models and GGUF files — ready to download."
      />
      <EmptyState title="No artifacts yet">
        <p>Each fine-tune leaves an adapter here; export jobs add merged and GGUF files.</p>
      </EmptyState>
    </>
  )
}
