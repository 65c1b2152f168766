import { Link, useLocation } from 'react-router'
import { PageHeader } from '../components/PageHeader'

export function NotFoundPage() {
  const { pathname } = useLocation()
  return (
    <>
      <PageHeader title="Page not found" description={<>Nothing lives at <code>{pathname}</code>.</>} />
      <p>
        <Link to="/">Back to the queue</Link>
      </p>
    </>
  )
}
