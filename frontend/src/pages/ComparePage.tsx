import { EmptyState } from '../components/EmptyState'
import { PageHeader } from '../components/PageHeader'

export function ComparePage() {
  return (
    <>
      <PageHeader
        title="Compare"
        description="Several jobs side by side: their configurations, loss curves and throughput."
      />
      <EmptyState title="Nothing to compare yet">
        <p>Select two or more jobs from the queue to plot them on the same axes.</p>
      </EmptyState>
    </>
  )
}
